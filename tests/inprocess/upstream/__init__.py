"""In-process tests of gateway.upstream, one file per module."""
