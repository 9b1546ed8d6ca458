"""Capacity pools: the shared gate every upstream attempt passes, whoever makes it."""
