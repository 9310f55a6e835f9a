"""The gateway's view of its workers: ``worker`` (observed, leased, learned and agreed parts, one writer each)
and ``observe`` (the scraper of /health and /metrics). Imports only the transport beneath it."""
