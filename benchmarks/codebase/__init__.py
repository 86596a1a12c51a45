"""Measurements of the code itself (size, structure)."""
