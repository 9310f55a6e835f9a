"""The engines: the simulated worker, real vLLM on CPU, the upstream transports."""
