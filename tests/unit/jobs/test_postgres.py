from __future__ import annotations

import pytest

from sluicegate.jobs.postgres import open_postgres


async def test_a_schema_name_must_be_a_plain_identifier():
    with pytest.raises(ValueError, match="identifier"):
        await open_postgres("postgresql://unused", schema="x; DROP TABLE jobs")
