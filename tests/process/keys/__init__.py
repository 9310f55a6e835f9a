"""Keys on this machine's Redis and PostgreSQL (the in-process part: tests/inprocess/keys)."""
