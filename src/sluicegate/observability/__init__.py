"""Every metric the gateway exports, defined in one place with bounded labels."""
