"""How deep JSON may nest in what the gateway sends on.

orjson reads 1,024 levels but writes at most 254, so a value between the two would
parse here and fail when sent upstream.
"""

from __future__ import annotations

MAX_DEPTH = 128
"""Arrays and objects nested deeper are refused; room is left under orjson's 254 for
what adapters wrap around a caller's value."""


def too_deep(value: object, limit: int = MAX_DEPTH) -> bool:
    """Whether containers nest past `limit`; iterative, so it cannot exhaust the stack."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > limit:
            return True
        if isinstance(item, dict | list):
            inner = item.values() if isinstance(item, dict) else item
            pending.extend((v, depth + 1) for v in inner if isinstance(v, dict | list))
    return False
