"""Routing between workers: prefix-cache affinity within a load bound."""
