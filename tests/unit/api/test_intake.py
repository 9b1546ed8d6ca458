from __future__ import annotations

import pytest

from sluicegate.api.intake import plain, storable
from sluicegate.core.errors import GatewayError


@pytest.mark.parametrize("char", ["\x00", "\x07", "\t", "\n", "\x1b", "\x7f", "\x85", "\x9f"])
def test_a_control_character_is_never_stored(char: str):
    with pytest.raises(GatewayError) as info:
        plain(f"order{char}7", "idempotency_key")
    assert info.value.status == 400
    assert "'idempotency_key' must not contain control characters" in info.value.message
    assert not storable(f"job{char}")


def test_any_other_text_is_stored_as_it_came():
    for text in ("order-7", "commande n° 7", "注文 7", "🙂", "a b"):
        assert plain(text, "k") == text
        assert storable(text)
