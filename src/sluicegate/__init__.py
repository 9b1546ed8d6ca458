"""Sluicegate: an LLM gateway that keeps accepted work inside real capacity."""
