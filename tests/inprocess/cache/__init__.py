"""In-process tests of gateway.cache, one file per module."""
