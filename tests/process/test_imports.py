"""The import graph: every gateway module imports on its own, and no module imports one above it.

"Above" is the request path read from the edge down: the entry points (cli) over the HTTP edge (gateway.http:
the app, its routes and guards, asgi), over the batch runner (a caller of the pipeline), over the pipeline,
over the runtime, over the steps' modules (auth, openai_api, cache, spend, scheduling, upstream, fleet,
ledger, finance ...), over the sink, over the one renderer of outcomes (gateway.outcomes), over the shared leaves
(context, errors, sse, metrics, the endpoints: one object per API, policy). The finance figures and documents
(gateway.finance) sit among the steps, under the edge's finance routes, and load no web framework.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Each layer may import only from layers after it (lower down). Modules not named sit in "steps".
LAYERS: list[set[str]] = [
    {"gateway.__main__", "gateway.cli"},
    {"gateway.http.server"},
    {"gateway.http.app"},
    {"gateway.http.reports_page"},
    {"gateway.http.gpu_reports", "gateway.http.statements"},
    {"gateway.http.admin", "gateway.http.keys_api", "gateway.http.reports", "gateway.http.batch_api",
     "gateway.http.objects", "gateway.http.console", "gateway.http.sso"},
    {"gateway.http.guards"},
    {"gateway.http.asgi", "gateway.http.responses", "gateway.http.errors"},
    {"gateway.batches.runner", "gateway.batches.audit"},
    {"gateway.pipeline"},
    {"gateway.runtime"},
    set(),  # the steps: everything not named
    {"gateway.sink"},
    {"gateway.outcomes"},
    {"gateway.context", "gateway.errors", "gateway.sse", "gateway.ops.metrics",
     *(f"gateway.endpoints{m}" for m in ("", ".base", ".checks", ".taps", ".generation", ".chat", ".completions",
                                          ".embeddings", ".responses"))},
    {"gateway.policy.loader"},
    {"gateway.policy.schema"},
]
STEPS = 10


def modules() -> list[str]:
    names = []
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def imports_of(module: str, known: set[str]) -> set[str]:
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gateway"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gateway"))
    return {m for m in found if m in known and m != module and not module.startswith(m + ".")} - {"gateway"}


def layer(module: str) -> int:
    return next((i for i, names in enumerate(LAYERS) if module in names), STEPS)


def test_no_module_imports_one_above_it() -> None:
    known = set(modules())
    wrong = [f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
             for m in sorted(known) for d in sorted(imports_of(m, known)) if layer(d) < layer(m)]
    assert wrong == []


def test_the_import_graph_has_no_cycles() -> None:
    known = set(modules())
    graph = {m: imports_of(m, known) for m in known}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for d in graph[m]:
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*trail[trail.index(d):], d]))
            if d not in state:
                visit(d, [*trail, d])
        state[m] = 2
    for m in sorted(known):
        if m not in state:
            visit(m, [m])


def package_of(module: str) -> str:
    """The room a module stands in: its package under gateway (gateway.http, gateway.upstream ...), or the
    module itself for one directly under gateway (gateway.pipeline)."""
    return ".".join(module.split(".")[:2])


def package_graph(known: set[str]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {package_of(m): set() for m in known}
    for m in known:
        graph[package_of(m)].update(package_of(d) for d in imports_of(m, known) if package_of(d) != package_of(m))
    return graph


def package_loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of packages (Tarjan): each one a knot of packages that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            knot = []
            while (w := stack.pop()) != v:
                knot.append(w)
            if knot:
                loops.append(sorted([*knot, v]))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return loops


def test_no_two_packages_import_each_other() -> None:
    """A loop between packages (the sink importing the web edge's renderer, the scraper importing the upstream
    client while upstream imports the fleet) ties their rooms into one knot: none may stand. The positive control
    adds one import that closes a loop, and the check must find it."""
    graph = package_graph(set(modules()))
    assert package_loops(graph) == []
    looped = {k: set(v) for k, v in graph.items()}
    looped["gateway.transport"].add("gateway.upstream")  # upstream imports transport: this closes a loop
    assert any({"gateway.transport", "gateway.upstream"} <= set(loop) for loop in package_loops(looped))


def test_below_the_edge_nothing_loads_the_web_framework() -> None:
    """The core (the pipeline and everything it imports) knows no HTTP server: loading it loads no Starlette,
    uvicorn or ASGI module, so a batch line, a test or another edge can run it as it is."""
    probe = ("import sys, gateway.pipeline, gateway.batches.runner, gateway.batches.audit; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn', 'asgiref')))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_finance_figures_load_no_web_framework() -> None:
    """gateway.finance builds what finance reads (figures, statements, the page's HTML) and knows no HTTP: loading
    every module of it loads no Starlette, uvicorn or ASGI module; the edge (gateway.http) turns its bodies into
    answers."""
    finance = [m for m in modules() if m == "gateway.finance" or m.startswith("gateway.finance.")]
    assert "gateway.finance.statements" in finance and "gateway.finance.page" in finance
    probe = (f"import sys, {', '.join(finance)}; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn', 'asgiref')))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_module_imports_on_its_own() -> None:
    def load(module: str) -> tuple[str, str]:
        done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        return module, done.stderr.strip().splitlines()[-1] if done.returncode else ""
    with ThreadPoolExecutor(max_workers=2) as pool:
        # __main__ runs the CLI when imported: that is its job, not an import-order dependency
        failures = [f"{m}: {err}" for m, err in pool.map(load, [m for m in modules() if not m.endswith("__main__")])
                    if err]
    assert failures == []


def test_the_benchmarks_never_import_the_tests() -> None:
    """loadtest/ is an installed package and tests/ is not: a benchmark that imports tests/ breaks outside a
    checkout. What both need (the test policy, its keys, reading a metric) is loadtest.harness (fixtures, policy)."""
    wrong = []
    for path in sorted((ROOT / "loadtest").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            wrong += [f"{path.relative_to(ROOT)}: {n}" for n in names if n == "tests" or n.startswith("tests.")]
    assert wrong == []
