"""The message a missing optional dependency gets: which extra brings it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def needs_extra(what: str) -> Iterator[None]:
    """Imports inside need the `guardrails` extra; without it, say so by name."""
    try:
        yield
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{what} needs the guardrails extra: pip install 'sluicegate[guardrails]'"
            f" ({exc.name} is missing)",
            name=exc.name,
        ) from exc
