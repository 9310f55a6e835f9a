"""Budget counters on this machine's Redis (the in-process part: tests/inprocess/spend)."""
