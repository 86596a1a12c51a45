"""Reliability: pre-training killed at random moments and resumed."""
