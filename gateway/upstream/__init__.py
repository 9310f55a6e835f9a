"""Keep-alive pools to the workers, dispatch with a retry before the first byte, and the response relay.

The transport beneath is the gateway's own HTTP/1.1 client (``gateway.transport.http1``, on httptools), for
requests and for the scrapes alike; what its failures mean for a worker and a request is ``errors``'s.
Why that client, against httpx, aiohttp, pyreqwest and aiosonic: docs/decisions/001-workers-http-client.md.
"""
