"""Spend control on the request path: budgets (reserve at admission, settle at finish) and cost anomalies."""
