"""The Batch API's lines and store, in-process."""
