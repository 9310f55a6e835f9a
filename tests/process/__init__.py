"""Real processes over loopback: simulated workers, the gateway, Redis, PostgreSQL, the clients."""
