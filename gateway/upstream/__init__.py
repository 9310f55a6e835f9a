"""Keep-alive pools to the workers, dispatch with a retry before the first byte, and the response relay.

Transport: aiohttp, directly. Chosen by measurement in this gateway (loadtest/RESULTS.md): as a bare
client, aiohttp costs 0.25-0.35 ms of CPU per request here, httpx on the aiohttp transport 0.5-0.7 ms
and httpx on httpcore 1.3-2.3 ms; inside the gateway, httpx's client, Request/URL models and Headers
lookups were a quarter of all CPU.
"""
