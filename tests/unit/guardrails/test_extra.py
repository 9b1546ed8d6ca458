"""A checker whose library is missing says which extra brings it."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    ("module", "library"),
    [("sluicegate.guardrails.terms", "ahocorasick"), ("sluicegate.guardrails.pii_kinds", "stdnum")],
)
def test_a_missing_library_names_the_guardrails_extra(monkeypatch, module: str, library: str):
    monkeypatch.setitem(sys.modules, library, None)
    monkeypatch.delitem(sys.modules, module)
    with pytest.raises(ModuleNotFoundError, match=r"sluicegate\[guardrails\]"):
        importlib.import_module(module)
