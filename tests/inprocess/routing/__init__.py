"""In-process tests of gateway.routing, one file per module."""
