"""Shared state, in-process."""
