"""Priority queues and fairness: overload against FIFO, tenants of one class, batches, the learned limits."""
