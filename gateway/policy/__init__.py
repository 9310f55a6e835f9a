"""The policy: its schema (pydantic, validated once at load) and its loader (check, diff, hot reload off the
loop). The bottom of the house: it imports nothing of the gateway."""
