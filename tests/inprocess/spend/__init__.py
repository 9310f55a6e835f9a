"""In-process tests of gateway.spend, one file per module."""
