"""Lanes, fair queues and the dispatcher: who is served next, and when."""
