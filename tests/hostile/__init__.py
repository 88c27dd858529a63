"""Hostile inputs for the edge: bad artifacts (corpus) and bad signatures (signatures)."""
