"""The simulator's settings, from an optional YAML file overlaid with command-line flags.

Flags arrive as strings and YAML as typed values; both pass through the same converters
so a bad value gets the same one-line message naming its field, whichever way it came.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

import yaml

from sluicegate.sim.engine import EngineSettings
from sluicegate.sim.faults import Faults
from sluicegate.sim.metrics import Generation


@dataclass(frozen=True, slots=True)
class SimOptions:
    host: str = "127.0.0.1"
    port: int = 8001
    models: tuple[str, ...] = ("sim-model",)
    guard_models: tuple[str, ...] = ()
    """Served models that answer as a guard model (`sim/guard.py`)."""
    api_key: str | None = None
    seed: int = 0
    metrics_generation: Generation = "current"
    engine: EngineSettings = field(default_factory=EngineSettings)
    faults: Faults = field(default_factory=Faults)


Converter = Callable[[str, object], object]


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string")
    return value


def _integer(name: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise ValueError(f"{name} must be an integer, not {value!r}")


def _number(name: str, value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise ValueError(f"{name} must be a number, not {value!r}")


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, not {value!r}")
    return value


def _models(name: str, value: object) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        raise ValueError(f"{name} must be a model name or a non-empty list of names")
    return tuple(_text(name, item) for item in names)


def _choice(*choices: str) -> Converter:
    def convert(name: str, value: object) -> str:
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
        return cast(str, value)

    return convert


def _nullable(convert: Converter) -> Converter:
    def nullable(name: str, value: object) -> object:
        return None if value is None else convert(name, value)

    return nullable


def _milliseconds(name: str, value: object) -> float:
    return _number(name, value) / 1000


# Option name (YAML key; the flag is the same with dashes) -> converter.
_TOP: dict[str, Converter] = {
    "host": _text,
    "port": _integer,
    "model": _models,
    "guard_model": _models,
    "api_key": _nullable(_text),
    "seed": _integer,
    "metrics_generation": _choice("current", "legacy"),
}
# Option name -> (EngineSettings field, converter).
_ENGINE: dict[str, tuple[str, Converter]] = {
    "max_num_seqs": ("max_num_seqs", _integer),
    "kv_cache_tokens": ("kv_cache_tokens", _integer),
    "block_size": ("block_size", _integer),
    "prefill_ms_per_token": ("prefill_s_per_token", _milliseconds),
    "step_base_ms": ("step_base_s", _milliseconds),
    "step_per_seq_ms": ("step_per_seq_s", _milliseconds),
    "time_scale": ("time_scale", _number),
    "max_model_len": ("max_model_len", _integer),
    "default_max_tokens": ("default_max_tokens", _integer),
    "scheduling_policy": ("scheduling_policy", _choice("fcfs", "priority")),
    "prefix_caching": ("prefix_caching", _flag),
}
# Option name -> (Faults field, converter); Faults.merge then checks the ranges.
_FAULTS: dict[str, tuple[str, Converter]] = {
    "slowdown": ("slowdown", _number),
    "error_rate": ("error_rate", _number),
    "error_status": ("error_status", _integer),
    "throttle_rate": ("throttle_rate", _number),
    "throttle_retry_after": ("throttle_retry_after_s", _nullable(_number)),
    "hang": ("hang", _flag),
    "drop_after_tokens": ("drop_after_tokens", _nullable(_integer)),
    "down": ("down", _flag),
    "retry_after_header": ("retry_after_header", _nullable(_text)),
    "redirect_to": ("redirect_to", _nullable(_text)),
    "body_lie": ("body_lie", _nullable(_text)),
    "metrics_lie": ("metrics_lie", _nullable(_text)),
}
OPTION_NAMES = frozenset(_TOP) | frozenset(_ENGINE) | frozenset(_FAULTS)


def load_options(flags: Mapping[str, object], config: str | None = None) -> SimOptions:
    """Options from the YAML file `config` (if any) overlaid with the flags that were given.

    `flags` maps option names to a flag's string (or bool, or list for --model), None
    when absent. Raises ValueError with a one-line message naming the bad field.
    """
    values = _read_yaml(config) if config else {}
    values.update(
        {name: value for name, value in flags.items() if name in OPTION_NAMES and value is not None}
    )
    top = {name: _TOP[name](name, value) for name, value in values.items() if name in _TOP}
    engine = {
        _ENGINE[name][0]: _ENGINE[name][1](name, value)
        for name, value in values.items()
        if name in _ENGINE
    }
    faults = Faults()
    faults.merge(
        {
            _FAULTS[name][0]: _FAULTS[name][1](name, value)
            for name, value in values.items()
            if name in _FAULTS
        }
    )
    if "model" in top:
        top["models"] = top.pop("model")
    if "guard_model" in top:
        top["guard_models"] = top.pop("guard_model")
    options = replace(SimOptions(engine=EngineSettings(**engine), faults=faults), **top)
    for name in options.guard_models:
        if name not in options.models:
            raise ValueError(f"guard_model {name!r} must also be a served model (model)")
    return options


def _read_yaml(path: str) -> dict[str, object]:
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read config {path}: {' '.join(str(exc).split())}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(f"config {path} must be a mapping of option names to values")
    for key in loaded:
        if key not in OPTION_NAMES:
            raise ValueError(f"config {path}: unknown option {key!r}")
    return loaded
