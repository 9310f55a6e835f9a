"""The HTTP API's stores on this machine's PostgreSQL (the in-process part: tests/inprocess/http)."""
