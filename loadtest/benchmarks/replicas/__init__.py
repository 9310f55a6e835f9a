"""Several processes and replicas: throughput per process, replicas at overload, a join, the scale signal."""
