"""What the gateway costs a request: added latency, CPU per request, function calls, idle CPU, traces."""
