"""Routing among replicas of one model (issue 47): every strategy on the same traffic."""
