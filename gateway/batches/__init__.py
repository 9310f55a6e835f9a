"""The OpenAI Batch API: files and batches (store), JSONL lines (streamed validation), the runner that claims lines
in idle capacity and enters the pipeline's lifecycle for each. Imports the pipeline and what it needs (runtime,
context, errors, sink, openai_api); nothing of the HTTP edge."""
