"""Spend control on the request path: budgets (reserve at admission, settle at finish), cost anomalies and their
alerts. Imports shared leaves, the ledger's prices and openai_api's Call; never the pipeline."""
