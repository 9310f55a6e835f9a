"""Real vLLM engines on CPU behind the gateway."""
