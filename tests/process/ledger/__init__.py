"""The ledger on this machine's PostgreSQL (the in-process part: tests/inprocess/ledger)."""
