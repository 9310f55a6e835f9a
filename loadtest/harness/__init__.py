"""The benchmarks' harness: what every benchmark (and the test suite) shares.

- ``procs``: start and stop simulated workers, gateways and nginx; read a process's CPU time.
- ``policy``: the one policy builder (the test policy, the embedded default trimmed, the bench tenant).
- ``fixtures``: the test policy's keys and the bench key; reading a metric from /metrics.
- ``spec``, ``workload``, ``client``, ``runner``: workload specs, the requests they make, the load client.
- ``stats``, ``report``: percentiles, goodput, per-class summaries; JSON, Markdown and plots.
- ``questions``: the cache benchmarks' generated questions and their rephrasing.
- ``hostile_worker``: a worker that breaks the HTTP rules on purpose.
- ``cli``: ``tollgate loadtest run | compare | ramp``.
- ``catalog``: the benchmarks under loadtest/benchmarks/ (``python -m loadtest list | run NAME``).

No module here imports a benchmark; a benchmark imports only the harness (tests/inprocess/test_benchmarks.py).
"""
