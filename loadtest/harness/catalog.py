"""The benchmarks under loadtest/benchmarks/GROUP/NAME.py, read from their source: nothing is imported to list
them (a benchmark's own imports, pyreqwest or vLLM, are its business), and a name is unique across groups, so
``python -m loadtest run NAME`` needs no group."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# the order loadtest/RESULTS.md reads them in; a group not named here comes after these
GROUPS = ("overhead", "scheduling", "routing", "cache", "money", "hostile", "replicas", "engine")
_COMMAND = re.compile(r"\s*\(python -m loadtest run [^)]*\)")


@dataclass(frozen=True)
class Benchmark:
    group: str
    name: str
    path: Path

    @property
    def module(self) -> str:
        return f"loadtest.benchmarks.{self.group}.{self.name}"

    def docstring(self) -> str:
        return ast.get_docstring(ast.parse(self.path.read_text())) or ""

    def summary(self) -> str:
        """The docstring's first line, without the command it names (the list prints its own)."""
        first = self.docstring().strip().splitlines()[0] if self.docstring().strip() else "(no docstring)"
        return _COMMAND.sub("", first)


def benchmarks() -> dict[str, Benchmark]:
    """Every benchmark by name, in group order then name order."""
    found: dict[str, Benchmark] = {}
    def order(path: Path) -> tuple[int, str, str]:
        group = path.parent.name
        return (GROUPS.index(group) if group in GROUPS else len(GROUPS), group, path.stem)
    for path in sorted(BENCHMARKS.glob("*/*.py"), key=order):
        if path.name.startswith("_"):
            continue
        bench = Benchmark(path.parent.name, path.stem, path)
        if bench.name in found:
            raise RuntimeError(f"two benchmarks named {bench.name}: {found[bench.name].path} and {path}")
        found[bench.name] = bench
    return found
