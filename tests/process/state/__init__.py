"""Shared state on this machine's Redis (the in-process part: tests/inprocess/state)."""
