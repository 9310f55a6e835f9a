"""The HTTP/1.1 client to the workers, in-process."""
