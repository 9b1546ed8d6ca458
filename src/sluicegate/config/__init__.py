"""YAML + `${VAR}` loading, validated by pydantic, turned once into `core.types.Settings`."""

from sluicegate.config.loader import ConfigError, load_settings

__all__ = ["ConfigError", "load_settings"]
