"""The edge, the only code that knows HTTP: the server's limits, ASGI, the app and its routes, guards per role,
admin, reports, the finance page, Files and Batches. It may import anything below it; nothing imports it but the
command line (gateway.cli)."""
