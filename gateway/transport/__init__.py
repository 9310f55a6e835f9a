"""The HTTP/1.1 client to the workers (``http1``): connections, framing, caps and its own errors. It sits at the
bottom of the house and imports nothing of the gateway, so the fleet's scraper and the upstream dispatch can both
use it without importing each other; what its errors mean for a worker is ``gateway.upstream.errors``'s. Why our
own client: docs/decisions/001-workers-http-client.md."""
