"""Flower strategies, one merge policy each."""
