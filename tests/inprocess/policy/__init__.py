"""The policy, in-process."""
