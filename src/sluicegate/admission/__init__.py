"""Boundary gates: route, tenant and aggregate limits, token estimates, deadlines."""
