"""The response cache: keys, the store (in-process or Redis), the faiss index, the embedder (off the loop), the
near-miss verifier and its lexicons, replay, and the byte bounds. Imports only shared leaves (context, sse,
endpoints, policy, ops metrics, state); the pipeline calls it, never the other way. Why the layers, embedders,
thresholds, verifier and audit are as they are: docs/decisions/004-cache-embedder-and-error-bound.md."""
