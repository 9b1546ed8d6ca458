"""Implementations of `core.limits.LimitStore`."""
