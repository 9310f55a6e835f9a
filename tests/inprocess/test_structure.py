"""Who writes what: each field of a request's context, and each part of a worker, has one writing module.

Read from the source (assignments and augmented assignments to ``ctx.<field>``, ``<x>.observed.<field>``,
...), so a second writer fails here before it confuses a reader. ``gateway/context.py`` names each field's
writer beside it; the table below must agree with it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "gateway"

# RequestContext field -> the one module that writes it (after construction)
CONTEXT_WRITERS = {
    "tenant": "gateway/http/app.py", "key_id": "gateway/http/app.py", "probe": "gateway/http/app.py",
    "status": "gateway/pipeline.py",
    "model": "gateway/openai_api.py", "stream": "gateway/openai_api.py",
    "max_tokens_applied": "gateway/openai_api.py", "tags": "gateway/openai_api.py",
    "batch": "gateway/batches/runner.py",
    "service_class": "gateway/pipeline.py",
    "cache": "gateway/cache/decision.py", "cache_similarity": "gateway/cache/decision.py",
    "cache_reason": "gateway/cache/decision.py", "cache_nearest": "gateway/cache/decision.py",
    "worker": "gateway/upstream/dispatch.py", "attempts": "gateway/upstream/dispatch.py",
    "route": "gateway/upstream/dispatch.py", "past_limit": "gateway/scheduling/controller.py",
    "prompt_tokens": "gateway/pipeline.py", "completion_tokens": "gateway/pipeline.py",
    "cached_tokens": "gateway/pipeline.py", "usage_estimated": "gateway/pipeline.py",
    "reservation": "gateway/spend/service.py", "charge": "gateway/pipeline.py",
    "cost_usd": "gateway/accounting.py", "price_version": "gateway/accounting.py",
    "error": "gateway/pipeline.py", "trace": "gateway/http/app.py", "answered_by": "gateway/pipeline.py",
}
TIMING_WRITERS = {
    "queue_wait": "gateway/scheduling/controller.py", "cache": "gateway/cache/decision.py",
    "upstream_connect": "gateway/upstream/dispatch.py", "tpot": "gateway/pipeline.py",
    "total": "gateway/accounting.py", "ttft": "gateway/context.py",
    "cache_at": "gateway/cache/decision.py", "dispatch_at": "gateway/upstream/dispatch.py",
}
# Worker part -> the one module that writes into it
WORKER_PART_WRITERS = {
    "observed": "gateway/fleet/observe.py", "learned": "gateway/scheduling/capacity.py",
    "agreed": "gateway/state/replicas.py",
}
# the batch runner builds a context for each line as the HTTP edge does for a request (under the key that
# created the batch), and the cache audit for each re-ask (under its own key id)
ALSO = {("tenant", "gateway/batches/runner.py"), ("key_id", "gateway/batches/runner.py"),
        ("tenant", "gateway/batches/audit.py"), ("key_id", "gateway/batches/audit.py")}


def targets(tree: ast.AST) -> list[ast.expr]:
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                found.extend(target.elts if isinstance(target, ast.Tuple) else [target])
        elif isinstance(node, ast.AugAssign | ast.AnnAssign) and node.value is not None:
            found.append(node.target)
    return found


def writes() -> list[tuple[str, str, str]]:
    """(module path, what kind of field, field) for every attribute assignment in the gateway."""
    out = []
    for path in sorted(GATEWAY.rglob("*.py")):
        module = str(path.relative_to(ROOT))
        for target in targets(ast.parse(path.read_text())):
            if not isinstance(target, ast.Attribute):
                continue
            owner = target.value
            owner_name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) \
                else ""
            if owner_name == "ctx":
                out.append((module, "context", target.attr))
            elif owner_name == "timings" or (owner_name == "t" and target.attr in TIMING_WRITERS):
                out.append((module, "timings", target.attr))
            elif owner_name in WORKER_PART_WRITERS:
                out.append((module, owner_name, target.attr))
            elif target.attr == "inflight" and owner_name in ("worker", "w"):
                out.append((module, "leased", "inflight"))
    return out


def test_each_context_field_has_one_writer() -> None:
    wrong = [f"{module} writes ctx.{name} (its writer is {CONTEXT_WRITERS.get(name)})"
             for module, kind, name in writes() if kind == "context"
             if CONTEXT_WRITERS.get(name) != module and (name, module) not in ALSO]
    assert wrong == []


def test_each_timing_has_one_writer() -> None:
    wrong = [f"{module} writes timings.{name}" for module, kind, name in writes()
             if kind == "timings" and TIMING_WRITERS.get(name) != module]
    assert wrong == []


def test_each_part_of_a_worker_has_one_writer() -> None:
    wrong = [f"{module} writes worker.{kind}.{name}" for module, kind, name in writes()
             if kind in WORKER_PART_WRITERS and WORKER_PART_WRITERS[kind] != module]
    wrong += [f"{module} writes worker.inflight" for module, kind, _ in writes()
              if kind == "leased" and module != "gateway/upstream/dispatch.py"]
    assert wrong == []


def test_the_context_names_the_same_writers() -> None:
    """context.py's comment beside each field names the module of the table above."""
    source = (GATEWAY / "context.py").read_text()
    missing = []
    for name, module in CONTEXT_WRITERS.items():
        dotted = module.removeprefix("gateway/").removesuffix(".py").replace("/", ".")
        line = next((line for line in source.splitlines() if line.strip().startswith(f"{name}:")), "")
        if dotted not in line:
            missing.append(f"{name}: {dotted}")
    assert missing == []


def test_the_checks_see_a_second_writer() -> None:
    """Positive control: a module that writes a field it does not own is caught."""
    tree = ast.parse("ctx.model = 'x'\nworker.observed.healthy = True\nctx.timings.tpot = 1.0\n")
    kinds = {(t.value.id if isinstance(t.value, ast.Name) else t.value.attr, t.attr) for t in targets(tree)
             if isinstance(t, ast.Attribute)}
    assert kinds == {("ctx", "model"), ("observed", "healthy"), ("timings", "tpot")}


IN_PROCESS = ROOT / "tests" / "inprocess"
STARTERS = ("loadtest.harness.procs", "subprocess", "multiprocessing", "tests.conftest.start")


def process_starters(tree: ast.AST) -> list[str]:
    """What in a test module starts a process: an import of a process starter, or a fixture that starts one."""
    found = []
    for node in ast.walk(tree):
        imported = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        found += [f"imports {m}" for m in imported if m.startswith(STARTERS)]
        if isinstance(node, ast.arg) and node.arg in ("start_sim", "start_gateway", "vllm_server"):
            found.append(f"takes the {node.arg} fixture")
    return found


def test_the_in_process_layer_starts_no_process() -> None:
    """The tests `make unit` runs (everything under tests/inprocess) import nothing that starts a process; the
    positive control is a module that does."""
    wrong = [f"{path.relative_to(ROOT)} {why}" for path in sorted(IN_PROCESS.rglob("*.py"))
             for why in process_starters(ast.parse(path.read_text()))]
    assert wrong == []
    assert process_starters(ast.parse("import subprocess\ndef test(start_sim): ...\n")) == [
        "imports subprocess", "takes the start_sim fixture"]


# What needs a server: this machine's Redis or PostgreSQL by tests/conftest.py's names for them (and its pg_dsn
# fixture), their client libraries, and their loopback addresses.
SERVER_NAMES = ("REDIS_URL", "PG_ADMIN_DSN", "PG_TEST_DB", "pg_dsn")
SERVER_CLIENTS = ("redis", "psycopg")
SERVER_ADDRESSES = ("127.0.0.1:6379", "localhost:6379", "[::1]:6379", "127.0.0.1:5432", "localhost:5432",
                    "[::1]:5432")


def servers_used(tree: ast.AST) -> list[str]:
    """What in a test module needs a server to be running: a name of this machine's Redis or PostgreSQL (imported,
    read, taken as a fixture or asked for by name), an import of their clients, or one of their addresses."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"imports {m}" for m in modules if m.split(".")[0] in SERVER_CLIENTS]
            found += [f"imports {a.name}" for a in node.names if a.name in SERVER_NAMES]
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else \
            node.arg if isinstance(node, ast.arg) else None
        if name in SERVER_NAMES:
            found.append(f"names {name}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in SERVER_NAMES:
                found.append(f"asks for {node.value}")
            found += [f"dials {address}" for address in SERVER_ADDRESSES if address in node.value]
    return found


def test_the_in_process_layer_needs_nothing_but_python() -> None:
    """`make unit` runs with no server: no in-process test module names this machine's Redis or PostgreSQL
    (tests/conftest.py's REDIS_URL, the pg_dsn fixture), imports their clients or dials their ports. Such a test
    stands in tests/process (a test run on several stores keeps its in-process store here, and tests/process
    collects it again on Redis or PostgreSQL). The positive control is a module that does each."""
    wrong = [f"{path.relative_to(ROOT)} {why}" for path in sorted(IN_PROCESS.rglob("*.py"))
             if path.name != "test_structure.py" for why in servers_used(ast.parse(path.read_text()))]
    assert wrong == []
    control = ("import redis\nfrom tests.conftest import REDIS_URL\n"
               "def test(pg_dsn, request): request.getfixturevalue('pg_dsn')\n"
               "STORE = 'redis://127.0.0.1:6379/15'\n")
    assert sorted(servers_used(ast.parse(control))) == [
        "asks for pg_dsn", "dials 127.0.0.1:6379", "imports REDIS_URL", "imports redis", "names pg_dsn"]
    assert servers_used(ast.parse("DOWN = 'redis://127.0.0.1:1/0'\nSHOWN = 'redis://cache:6379/0'\n")) == [], \
        "a port nothing listens on, or a policy's URL that is only read, needs no server"


def test_every_test_stands_in_its_layer() -> None:
    """A test module stands in tests/inprocess, tests/process or tests/vllm: where it stands says what it starts
    (tests/conftest.py marks the in-process layer by that alone)."""
    loose = [p.name for p in (ROOT / "tests").glob("test_*.py")]
    assert loose == []


def imported_modules(tree: ast.AST) -> set[str]:
    """Every gateway module a test module imports (``from gateway.x import y`` imports gateway.x.y when y is a
    module, and every package above it)."""
    named: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            named.add(node.module)
            named.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            named.update(a.name for a in node.names)
    return {".".join(m.split(".")[:i]) for m in named for i in range(1, m.count(".") + 2)}


def gateway_modules() -> set[str]:
    names = set()
    for path in (ROOT / "gateway").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_gateway_module_is_imported_by_an_in_process_test() -> None:
    """Each module under gateway/ has an in-process test that imports it (a package, when a module under it is
    imported), so `make unit` reaches every room of the house; the positive control finds a module no test
    imports."""
    seen: set[str] = set()
    for path in IN_PROCESS.rglob("test_*.py"):
        seen |= imported_modules(ast.parse(path.read_text()))
    assert sorted(gateway_modules() - seen) == []
    assert imported_modules(ast.parse("from gateway.cache import keys\n")) >= {"gateway", "gateway.cache",
                                                                              "gateway.cache.keys"}
    assert "gateway.cache.lexicon" not in imported_modules(ast.parse("from gateway.cache import keys\n"))
