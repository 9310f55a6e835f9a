"""In-process tests of gateway.http, one file per module."""
