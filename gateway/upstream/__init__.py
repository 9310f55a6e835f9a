"""Keep-alive pools to the workers, dispatch with a retry before the first byte, and the response relay.

Transport: the gateway's own HTTP/1.1 client (http1.py, on httptools), for requests and for the scrapes alike.
Chosen by measurement (loadtest/RESULTS.md): httpx's client, Request/URL models and Headers lookups were a
quarter of the gateway's CPU, and aiohttp's request path, which replaced it, was ~40% of the loop's CPU under
load.
"""
