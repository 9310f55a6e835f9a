"""Hostile inputs: clients, workers, tenants and policies that try to take memory, time or money."""
