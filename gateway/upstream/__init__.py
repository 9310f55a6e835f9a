"""Keep-alive pools to the workers, dispatch with a retry before the first byte, and the response relay.

The transport beneath is the gateway's own HTTP/1.1 client (``gateway.transport.http1``, on httptools), for
requests and for the scrapes alike; what its failures mean for a worker and a request is ``errors``'s.
Chosen by measurement (loadtest/RESULTS.md): httpx's client, Request/URL models and Headers lookups were a
quarter of the gateway's CPU, and aiohttp's request path, which replaced it, was ~40% of the loop's CPU under
load.
"""
