"""API keys made at runtime (the admin API, `tollgate keys`), beside the ones the policy lists, and the audit log
of admin actions: both kept in the state store (SQLite in the data directory, PostgreSQL with
``state.postgres_dsn``). ``model``: a key's record and the tenant view it narrows; ``store``: the tables;
``service``: the in-memory map requests are checked against, kept in step with the store by a short poll.

Imports the policy, the errors and nothing of the request path: auth, the rate limiter and spend read it.
"""
