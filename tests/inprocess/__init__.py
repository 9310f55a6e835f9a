"""Tests that start no process: the in-process layer (`make unit`), in folders that mirror gateway/ and workers/."""
