"""A failed answer is tallied by its error code, so a refusal names its cause."""

from __future__ import annotations

import pytest

from sluicegate.bench.loadgen import _error_code


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"error": {"code": "limit_store_unavailable", "type": "x"}}', "limit_store_unavailable"),
        (
            b'{"error": {"code": null, "type": "service_unavailable_error"}}',
            "service_unavailable_error",
        ),
        (b"<html>bad gateway</html>", "-"),
        (b'{"error": "plain"}', "-"),
        (b"[]", "-"),
    ],
)
def test_an_error_body_gives_its_code(body: bytes, code: str) -> None:
    assert _error_code(body) == code
