"""Money: the ledger under chaos, statements and reports over a month, GPU cost per tenant."""
