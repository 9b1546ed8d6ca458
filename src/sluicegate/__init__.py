"""Sluicegate: an LLM gateway that keeps accepted work inside real capacity.

`sluicegate.Governor` is library mode (see `sluicegate.library`), imported on first use
so that `import sluicegate` stays light for the CLI and the policy modules.
"""

from __future__ import annotations

from typing import Any

_LIBRARY = frozenset({"Governor", "Grant", "GatewayError", "ConfigError"})


def __getattr__(name: str) -> Any:
    if name in _LIBRARY:
        from sluicegate import library

        return getattr(library, name)
    raise AttributeError(f"module 'sluicegate' has no attribute {name!r}")
