"""The edge, the only code that knows HTTP: the server's limits, ASGI, the app and its routes, guards per role,
admin, the finance routes (reports, statements, the finance page and its sign-in: their parameters, guards and
answers; the figures and documents they answer with are gateway.finance's), Files and Batches. It may import
anything below it; nothing imports it but the command line (gateway.cli)."""
