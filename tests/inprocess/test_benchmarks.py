"""The benchmarks' layout: loadtest/harness/ holds what they share, loadtest/benchmarks/GROUP/NAME.py are the
benchmarks, no benchmark imports another (what two need lives in the harness) and the harness imports none; the
harness's policies are valid. Read from the source: nothing here imports a benchmark or starts a process."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from gateway.policy.loader import parse_policy
from loadtest.__main__ import main as loadtest_main
from loadtest.harness.catalog import BENCHMARKS, benchmarks
from loadtest.harness.policy import Base, build_policy

ROOT = Path(__file__).resolve().parents[2]
LOADTEST = ROOT / "loadtest"


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def exists(module: str) -> bool:
    path = ROOT / Path(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(tree: ast.AST, module: str) -> list[tuple[str, bool]]:
    """(a module the source imports, whether in a fallback for an old checkout) for every import; relative imports
    resolved against ``module``'s package, and ``from a import b`` names a.b as well (b may be a module). A fallback
    is an ``except ModuleNotFoundError`` handler or the body of ``if old_layout():``."""
    fallback: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
                if any(isinstance(t, ast.Name) and t.id == "ModuleNotFoundError" for t in caught):
                    fallback.update(id(n) for n in ast.walk(handler))
        elif (isinstance(node, ast.If) and isinstance(node.test, ast.Call) and isinstance(node.test.func, ast.Name)
              and node.test.func.id == "old_layout"):
            fallback.update(id(n) for part in node.body for n in ast.walk(part))
    found: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, id(node) in fallback) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[:-node.level]
                base = ".".join([*package, *([node.module] if node.module else [])])
            found.append((base, id(node) in fallback))
            found += [(f"{base}.{a.name}", id(node) in fallback) for a in node.names]
    return found


def wrong_imports(source: str, module: str) -> list[str]:
    """What a benchmark may not import: another benchmark (anything under loadtest.benchmarks), or any loadtest
    module outside the harness, except, in a fallback for a checkout from before loadtest/harness/ (calls, ab), a
    module this tree does not have (a fallback never excuses a benchmark of this tree)."""
    wrong = []
    for name, in_fallback in imports(ast.parse(source), module):
        if name == module or not (name == "loadtest" or name.startswith("loadtest.")):
            continue
        if name == "loadtest.benchmarks" or name.startswith("loadtest.benchmarks."):
            wrong.append(f"imports {name}")
        elif name in ("loadtest", "loadtest.harness") or name.startswith("loadtest.harness."):
            continue
        elif not (in_fallback and not exists(name)):
            wrong.append(f"imports {name}")
    return sorted(set(wrong))


def benchmark_files() -> list[Path]:
    return sorted(p for p in BENCHMARKS.glob("*/*.py") if not p.name.startswith("_"))


def test_no_benchmark_imports_another() -> None:
    wrong = [f"{path.relative_to(ROOT)} {why}" for path in benchmark_files()
             for why in wrong_imports(path.read_text(), module_of(path))]
    assert wrong == []


def test_the_check_catches_a_planted_import() -> None:
    """Positive control: a benchmark importing another, absolutely, relatively or as a package member, is caught;
    so is an old-layout module outside a fallback; the old layout inside one is not."""
    module = "loadtest.benchmarks.scheduling.fairness"
    planted = {
        "from loadtest.benchmarks.overhead.overhead import SCENARIOS\n": ["loadtest.benchmarks.overhead.overhead"],
        "from ..cache import cache_hog\n": ["loadtest.benchmarks.cache.cache_hog"],
        "from . import scheduling\n": ["loadtest.benchmarks.scheduling.scheduling"],
        "import loadtest.benchmarks.money.ledger\n": ["loadtest.benchmarks.money.ledger"],
        "from loadtest.benchmarks.cache import cache\n": ["loadtest.benchmarks.cache.cache"],
        "from loadtest.bench_overhead import policy\n": ["loadtest.bench_overhead", "loadtest.bench_overhead.policy"],
    }
    for source, names in planted.items():
        assert all(f"imports {n}" in wrong_imports(source, module) for n in names), source
    fallback = ("try:\n    from loadtest.harness.procs import start_sim\nexcept ModuleNotFoundError:\n"
                "    from loadtest.procs import start_sim\n")
    assert wrong_imports(fallback, module) == []
    assert wrong_imports("if old_layout():\n    from loadtest.bench_overhead import policy\n", module) == []
    assert wrong_imports("if old_layout():\n    from loadtest.benchmarks.overhead import ab\n", module) == [
        "imports loadtest.benchmarks.overhead", "imports loadtest.benchmarks.overhead.ab"]
    assert wrong_imports("from loadtest.harness.policy import build_policy\n", module) == []


def test_the_harness_imports_no_benchmark() -> None:
    wrong = [f"{path.relative_to(ROOT)} imports {name}" for path in sorted((LOADTEST / "harness").glob("*.py"))
             for name, _ in imports(ast.parse(path.read_text()), module_of(path))
             if name.startswith("loadtest.benchmarks")]
    assert wrong == []


def test_every_benchmark_is_listed_once_with_what_it_measures(capsys: pytest.CaptureFixture[str]) -> None:
    found = benchmarks()
    assert sorted(b.path for b in found.values()) == benchmark_files()
    for name, bench in found.items():
        doc = bench.docstring()
        assert doc and f"python -m loadtest run {name}" in doc, f"{bench.path}: its docstring names its command"
        assert "__name__ == \"__main__\"" in bench.path.read_text(), f"{bench.path}: runs as a module"
    assert loadtest_main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(found)
    assert all(len(line.split(None, 2)) == 3 and "python -m" not in line for line in lines)


@pytest.mark.parametrize("base", ["test", "default", "bench"])
def test_every_policy_base_of_the_harness_is_a_valid_policy(base: Base) -> None:
    """The benchmarks' policies load as a gateway would load them: the default base follows policies/default.yaml,
    so a model it drops must leave no tenant naming it (its cache settings included)."""
    parse_policy(yaml.safe_dump(build_policy(["http://127.0.0.1:1"], base)))
