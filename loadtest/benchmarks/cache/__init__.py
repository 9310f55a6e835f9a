"""The response cache: latency, TTFT beside CPU hogs, the audit, diagnose past the cache."""
