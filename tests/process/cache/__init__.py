"""The cache on this machine's Redis (the in-process part: tests/inprocess/cache)."""
