"""In-house checks as Python classes, named in config by `module:Class`.

The class is built once at start with the checker's `options` as keyword arguments and
must answer the `Checker` protocol (a `name`, an `async check(text, stage)` returning a
`Verdict`); the module must be importable by the gateway's interpreter.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from sluicegate.guardrails.checker import Checker


class PluginError(Exception):
    """The named class cannot be found or built, or is not a checker."""


def load_plugin(path: str, options: Mapping[str, Any], name: str) -> Checker:
    module_name, _, class_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"guardrail {name!r}: cannot import {module_name!r}: {exc}") from None
    cls = getattr(module, class_name, None)
    if not callable(cls):
        raise PluginError(f"guardrail {name!r}: {module_name!r} has no class {class_name!r}")
    try:
        checker = cls(**options)
    except Exception as exc:
        raise PluginError(f"guardrail {name!r}: {path} could not be built: {exc}") from None
    if not callable(getattr(checker, "check", None)):
        raise PluginError(f"guardrail {name!r}: {path} has no check(text, stage) method")
    if not isinstance(getattr(checker, "name", None), str):
        raise PluginError(f"guardrail {name!r}: {path} has no name")
    return checker
