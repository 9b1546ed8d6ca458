"""Adapters to upstream providers; each normalises its provider's errors into `GatewayError`."""
