"""In-process tests of gateway.keys, one file per module."""
