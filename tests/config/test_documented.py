"""Every YAML block in the README and docs/, and every example config, loads as written:
a whole config as a config,
a fragment (its first line `# fragment: a.dotted.path`) as that part of one. Each
`${VARIABLE}` and each key's `env:` is given a value, as a deployment would."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluicegate.config.loader import parse_settings
from tests.config.test_config import base

ROOT = Path(__file__).parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRAGMENT = re.compile(r"#\s*fragment:\s*([\w.]+)")


def blocks() -> list[tuple[str, str]]:
    found = [
        (str(path.relative_to(ROOT)), path.read_text())
        for path in sorted((ROOT / "examples").glob("*.yaml"))
    ]
    for document in DOCUMENTS:
        text = document.read_text()
        for match in re.finditer(r"^```ya?ml\n(.*?)^```", text, flags=re.S | re.M):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{document.relative_to(ROOT)}:{line}", match.group(1)))
    return found


def variables(block: str) -> dict[str, str]:
    """A value for each variable the block needs (one with a default needs none), of the
    kind its name says."""
    names = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", block))
    names |= set(re.findall(r"env:\s*([A-Za-z_][A-Za-z0-9_]*)", block))
    return {name: value_for(name) for name in names}


def value_for(name: str) -> str:
    if "REDIS" in name:
        return "redis://127.0.0.1:6379/0"
    if name.endswith("DSN"):
        return "postgresql://127.0.0.1:5432/test"
    if name.endswith("URL"):
        return "http://127.0.0.1:9/v1"
    return f"value-of-{name.lower()}"


def placed(path: str, fragment: Any) -> dict:
    """A whole config with `fragment` at `path`."""
    raw: dict = base()
    *parents, last = path.split(".")
    at = raw
    for part in parents:
        at = at.setdefault(part, {})
    at[last] = fragment
    return raw


def test_the_documents_hold_yaml_blocks():
    assert blocks(), "no YAML block found: the pattern no longer matches the documents"


@pytest.mark.parametrize(("where", "block"), blocks(), ids=[where for where, _ in blocks()])
def test_every_documented_yaml_block_loads_as_written(where: str, block: str):
    loaded = yaml.safe_load(block)
    first = block.lstrip().splitlines()[0]
    fragment = FRAGMENT.fullmatch(first.strip())
    raw = placed(fragment.group(1), loaded) if fragment else loaded
    env = {"ALICE_KEY": "sk-alice", "SIM_URL": "http://127.0.0.1:9/v1", **variables(block)}
    parse_settings(raw, where, env)
