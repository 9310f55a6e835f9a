"""In-process tests of gateway.scheduling, one file per module."""
