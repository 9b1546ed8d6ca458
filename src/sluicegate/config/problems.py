"""What is wrong with a config, in words a person can act on: where, why, and what to
write instead; and which references across sections fail among the parts that parsed."""

from __future__ import annotations

import copy
import difflib
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from sluicegate.config.schema import CheckerConfig, GatewayConfig

ACROSS = "(across sections)"
"""Where a problem of references between sections is reported."""


def described(exc: ValidationError) -> list[tuple[tuple[Any, ...], str]]:
    """Each error of `exc` with its location, a line each (a check across sections may
    name several problems)."""
    found = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        where = path(_untagged(loc)) or ACROSS
        hint = _hint(error["type"], loc)
        message = str(error["msg"]).removeprefix("Value error, ")
        found += [(loc, f"{where}: {line}{hint}") for line in message.splitlines()]
    return found


def across(data: dict[str, Any], exc: ValidationError) -> list[str]:
    """The problems across sections among the parts that parsed: the parts in error are
    left out (an unknown key, a list's item holding an error, else the key in error)
    until what is left validates or only the check across sections fails; a problem
    naming a part left out is not one."""
    errors = exc.errors()
    if all(not tuple(e["loc"]) for e in errors):
        return []
    data = copy.deepcopy(data)
    removed: set[str] = set()
    for _ in range(4):
        leftover = [e for e in errors if tuple(e["loc"])]
        if not leftover:
            break
        for loc in sorted({_part(e) for e in leftover}, key=_order, reverse=True):
            removed |= _strings(_remove(data, loc))
        try:
            GatewayConfig.model_validate(data)
        except ValidationError as again:
            errors = again.errors()
            continue
        return []
    found = []
    for error in errors:
        if tuple(error["loc"]):
            return []
        for line in str(error["msg"]).removeprefix("Value error, ").splitlines():
            if not any(f"'{name}'" in line for name in removed):
                found.append(f"{ACROSS}: {line}")
    return found


def _part(error: Any) -> tuple[Any, ...]:
    """What to leave out for `error`: a key that should not be there alone, else the
    innermost list item holding the error, else the key in error."""
    loc = tuple(error["loc"])
    if error["type"] == "extra_forbidden":
        return loc
    for i in range(len(loc) - 1, -1, -1):
        if isinstance(loc[i], int):
            return loc[: i + 1]
    return loc


def _order(loc: tuple[Any, ...]) -> tuple[tuple[int, int, str], ...]:
    """Locations in document order, list indices by number: taken out from the last, an
    item's removal moves none still to go."""
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in loc)


def _remove(data: Any, loc: tuple[Any, ...]) -> Any:
    """Take the value at `loc` out of `data`; what it was (None if absent)."""
    parent = data
    for part in loc[:-1]:
        try:
            parent = parent[part]
        except (KeyError, IndexError, TypeError):
            return None
    try:
        return parent.pop(loc[-1]) if loc else None
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


def _strings(value: Any) -> set[str]:
    """Every string in `value`: the names a part left out may be referred by."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(_strings(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_strings(v) for v in value)) if value else set()
    return set()


def _hint(kind: str, loc: tuple[Any, ...]) -> str:
    """What to write instead: for a key the section does not have, the known key it is
    closest to, else the section's keys; for a section in the wrong shape, its form."""
    if kind == "extra_forbidden" and loc:
        model = _model_at(loc[:-1])
        if model is None:
            return ""
        known = list(model.model_fields)
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        if close:
            return f"; did you mean {close[0]!r}?"
        return f"; valid keys here: {', '.join(known)}"
    if kind in ("model_type", "dict_type"):
        model = _model_at(loc)
        if model is None:
            return ""
        forms = getattr(model, "FORMS", None)
        if forms is None:
            forms = "{" + ", ".join(f"{name}: ..." for name in model.model_fields) + "}"
        return f"; write it as {forms}"
    return ""


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The config section at `loc` (list indices skipped), if it is one; a checker's
    section is the one its `kind` tag names."""
    model: type[BaseModel] | None = GatewayConfig
    annotation: Any = None
    for part in loc:
        if isinstance(part, int):
            continue
        kinds = _kinds(annotation)
        if part in kinds:
            model = kinds[part]
            annotation = None
            continue
        field = None if model is None else model.model_fields.get(part)
        if field is None:
            return None
        annotation = field.annotation
        model = _model_in(annotation)
    return model


def _kinds(annotation: Any) -> dict[str, type[BaseModel]]:
    """The sections of a union chosen by `kind`, by their tag."""
    found = {}
    for arg in get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel) and "kind" in arg.model_fields:
            for tag in get_args(arg.model_fields["kind"].annotation):
                found[tag] = arg
        else:
            found |= _kinds(arg)
    return found


_TAGS = frozenset(_kinds(CheckerConfig))


def _untagged(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """`loc` without the `kind` tag pydantic puts after a checker's key: the field is
    `checker.terms`, not `checker.banned_terms.terms`."""
    return tuple(
        part
        for i, part in enumerate(loc)
        if not (i and loc[i - 1] in ("checker", "fallback") and part in _TAGS)
    )


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
