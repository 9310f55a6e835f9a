"""In-process tests of gateway.ops, one file per module."""
