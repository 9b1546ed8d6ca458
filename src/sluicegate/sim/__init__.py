"""A vLLM-like OpenAI-compatible backend that runs as a real process on loopback.

The gateway's tests, demo and benchmarks need a backend whose capacity, latency and
failures are known and repeatable: `engine` schedules sequences the way vLLM's continuous
batching does, `faults` injects failures on demand, `server` speaks OpenAI's HTTP API and
`metrics` exports vLLM's own Prometheus names.
"""
