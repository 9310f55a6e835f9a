"""python -m loadtest list | run NAME [flags]: the benchmarks under loadtest/benchmarks/.

``list`` prints each benchmark's name, group and what it measures (its docstring's first line); ``run NAME`` runs
loadtest.benchmarks.GROUP.NAME with the flags that follow (``run NAME --help`` prints them). The same module also
runs as ``python -m loadtest.benchmarks.GROUP.NAME``. The load generator itself is ``tollgate loadtest``.
"""

from __future__ import annotations

import runpy
import sys

from loadtest.harness.catalog import benchmarks


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    found = benchmarks()
    if command == "list":
        width = max(len(name) for name in found)
        for name, bench in found.items():
            print(f"{name:<{width}}  {bench.group:<10}  {bench.summary()}")
        return 0
    if command == "run" and rest:
        bench = found.get(rest[0])
        if bench is None:
            print(f"no benchmark named {rest[0]!r}; python -m loadtest list names them", file=sys.stderr)
            return 2
        sys.argv = [bench.module, *rest[1:]]
        runpy.run_module(bench.module, run_name="__main__", alter_sys=True)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
