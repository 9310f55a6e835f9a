"""The simulated worker's engine, in-process."""
