"""docs/configuration.md names every key of the config schema, with its default as the
schema has it: a key added to the schema without a row, or a default changed in one
place only, fails here.

The page's notation: a heading names a section by its path in backticks (`[]` for a
list's items, `routes.<route>` for the three routes); each row under it starts with
the key in backticks, then its default in backticks (under a heading without a path,
the key is a top-level one). A heading may name several sections of one shape, and
names their enclosing sections too. The checkers of a guardrail are
one table (their keys differ by `kind`), and a guardrail's `fallback` is a checker."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from sluicegate.config.schema import GatewayConfig, RoutesConfig

PAGE = Path(__file__).parents[2] / "docs" / "configuration.md"
ROUTES = tuple(RoutesConfig.model_fields)
NO_DEFAULT = object()
"""A default the page gives in words (a union's keys, a list of sections)."""


def models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in models_in(arg)]


def is_list(annotation: object) -> bool:
    if typing.get_origin(annotation) is list:
        return True
    return any(is_list(arg) for arg in typing.get_args(annotation))


def rendered(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list | dict) and not value:
        return "[]" if isinstance(value, list) else "{}"
    return str(value)


def default_of(field) -> object:
    if field.is_required():
        return "required"
    value = field.default if field.default is not PydanticUndefined else field.default_factory()
    if isinstance(value, BaseModel) or (
        isinstance(value, list) and value and isinstance(value[0], BaseModel)
    ):
        return NO_DEFAULT
    return rendered(value)


def keys(model: type[BaseModel] = GatewayConfig, at: str = "") -> Iterator[tuple[str, object]]:
    """Every key as (path, default), sections included (their default NO_DEFAULT)."""
    for name, field in model.model_fields.items():
        path = f"{at}{name}"
        if at == "routes.":
            path = "routes.<route>"
            if name != ROUTES[0]:
                continue
        inner = models_in(field.annotation)
        union = len(inner) > 1
        yield path, NO_DEFAULT if inner else default_of(field)
        if path.endswith("].fallback"):
            continue  # a checker: the same keys as `checker`
        below = f"{path}[]." if is_list(field.annotation) else f"{path}."
        for sub in inner:
            for key, default in keys(sub, below):
                yield key, NO_DEFAULT if union else default


def documented() -> dict[str, str]:
    """Each path the page names (headings and rows) -> its row's default ('' for a heading)."""
    found: dict[str, str] = {}
    sections = [""]
    fenced = False
    for line in PAGE.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        if line.startswith("#"):
            sections = re.findall(r"`([^`]+)`", line) if line.startswith(("##", "###")) else []
            sections = sections or [""]
            for section in sections:
                parts = section.split(".") if section else []
                for n in range(1, len(parts) + 1):
                    prefix = ".".join(parts[:n])
                    found.setdefault(prefix, "")
                    found.setdefault(prefix.removesuffix("[]"), "")
            continue
        row = re.match(r"^\| `([^`]+)` \| `?([^`|]*?)`?(?: [^|]*)? \|", line)
        if row:
            for section in sections:
                key = f"{section}.{row.group(1)}" if section else row.group(1)
                found[key] = row.group(2).strip()
    return found


SCHEMA = dict(keys())


def test_the_walk_finds_the_schema():
    assert "models[].deployments[].timeouts.read_s" in SCHEMA
    assert "routes.<route>.retry.max_attempts" in SCHEMA
    assert "guardrails.checks[].checker.url" in SCHEMA
    assert len(SCHEMA) > 150


@pytest.mark.parametrize("path", sorted(SCHEMA))
def test_every_key_is_on_the_page_with_its_default(path):
    page = documented()
    assert path in page, f"docs/configuration.md names no `{path}`"
    default = SCHEMA[path]
    if default is not NO_DEFAULT:
        assert page[path] == default, (
            f"`{path}`: the page says {page[path]!r}, the schema {default!r}"
        )


def test_the_page_names_no_key_the_schema_lacks():
    stale = sorted(path for path in documented() if path.removesuffix("[]") not in SCHEMA)
    assert not stale, f"docs/configuration.md names keys the schema has not: {stale}"
