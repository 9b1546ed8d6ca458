"""Durable asynchronous jobs: the store protocol, its SQLite and PostgreSQL backends."""
