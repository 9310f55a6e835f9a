"""The benchmarks, grouped by the question they answer (``python -m loadtest list`` names each).

A benchmark imports the harness (loadtest.harness), never another benchmark: what two of them share lives in the
harness. Each runs as ``python -m loadtest run NAME [flags]`` or ``python -m loadtest.benchmarks.GROUP.NAME``.
"""
