"""Guardrails: checks on prompts and answers, each a dependency with a time budget."""
