"""Benchmarks that drive real processes on loopback and report what they measured."""
