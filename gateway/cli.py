"""`tollgate`: up | serve | sim | policy check | keys new|create|list|revoke|rotate|expire | costs | diagnose |
worker render | loadtest."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from gateway.state.replicas import ALONE, Share

DEFAULT_POLICY = "policies/default.yaml"
DEMO_KEY = "tg-demo-key-change-me"
# The default policy's demo tokens (its comments name them): the banner shows those the policy in use still holds.
DEMO_TOKENS = (("standard tenant key", DEMO_KEY), ("premium tenant key", "tg-demo-premium-change-me"),
               ("batch tenant key", "tg-demo-batch-change-me"), ("admin token", "tg-admin-demo-change-me"),
               ("finance token", "tg-finance-demo-change-me"))
DEFAULT_DATA_DIR = ".tollgate"


def _policy_path(text: str) -> Path:
    path = Path(text)
    if not path.exists() and text == DEFAULT_POLICY:
        bundled = Path(__file__).resolve().parent.parent / DEFAULT_POLICY
        if bundled.exists():
            return bundled
    return path


def _serve(policy: Path, host: str, port: int, data_dir: Path, banner: str | None = None,
           share: Share = ALONE) -> None:
    import uvicorn

    from gateway.http.app import create_app
    from gateway.http.server import Limits, protocol_for
    from gateway.ops import heap
    from gateway.ops.logs import start_logging
    from gateway.policy.loader import PolicyError, PolicyStore

    try:
        store = PolicyStore.from_file(policy)
    except PolicyError as exc:
        sys.exit(f"tollgate: {policy} is not a valid policy:\n{exc}")
    listener = start_logging()
    heap.configure()
    server_policy = store.current.policy.server
    limits = Limits.from_policy(server_policy)
    data_dir.mkdir(parents=True, exist_ok=True)
    app = create_app(store, data_dir, share)
    config = uvicorn.Config(app, host=host, port=port, loop="uvloop", http=protocol_for(limits),
                            lifespan="on", access_log=False, log_level="warning",
                            timeout_keep_alive=int(max(1, server_policy.idle_timeout_s)),
                            limit_concurrency=server_policy.max_connections,
                            timeout_graceful_shutdown=int(server_policy.shutdown_grace_s),
                            proxy_headers=False, server_header=False)
    server = uvicorn.Server(config)
    stop = server.handle_exit

    def drain(sig: int, frame: object) -> None:
        """SIGTERM/SIGINT: /readyz turns 503 at once; uvicorn stops accepting and lets answers in flight
        finish for server.shutdown_grace_s."""
        app.gateway.draining = True
        stop(sig, frame)  # type: ignore[arg-type]
    server.handle_exit = drain  # type: ignore[method-assign]
    if banner:
        original_startup = server.startup

        async def startup(sockets: object = None) -> None:
            await original_startup(sockets)  # type: ignore[arg-type]
            print(banner, flush=True)
        server.startup = startup  # type: ignore[method-assign]
    try:
        if share.of > 1:  # one of N processes: each binds the port with SO_REUSEPORT
            from gateway.processes import reuse_port_socket

            server.run(sockets=[reuse_port_socket(host, port)])
        else:
            server.run()
    finally:
        listener.stop()


def cmd_serve(args: argparse.Namespace) -> None:
    policy = _policy_path(args.policy)
    if args.processes:  # one process of `--workers N`, started by the supervisor
        _serve(policy, args.host, args.port, Path(args.data_dir), share=Share(args.process_index, args.processes))
        return
    if args.gateway_processes <= 1:
        _serve(policy, args.host, args.port, Path(args.data_dir))
        return
    from gateway.policy.loader import PolicyError, load_file
    from gateway.processes import sharing_problems, supervise

    try:
        problems = sharing_problems(load_file(policy).policy)
    except PolicyError as exc:
        sys.exit(f"tollgate: {policy} is not a valid policy:\n{exc}")
    if problems:
        sys.exit("tollgate: --workers {} cannot share this policy's state:\n  {}".format(
            args.gateway_processes, "\n  ".join(problems)))
    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    sys.exit(supervise([sys.executable, "-m", "gateway", "serve", "--policy", str(policy), "--host", args.host,
                        "--port", str(args.port), "--data-dir", args.data_dir], args.gateway_processes))


def local_workers(policy_path: Path) -> list[tuple[int, list[tuple[str, str]]]]:
    """(port, [(served model name, kind)]) for each pool worker on this machine, from the policy."""
    from gateway.policy.loader import load_file

    policy = load_file(policy_path).policy
    by_port: dict[int, list[tuple[str, str]]] = {}
    for name, route in policy.models.items():
        for url in policy.pools[route.pool].workers:
            parsed = urlparse(str(url))
            if parsed.hostname in ("127.0.0.1", "localhost") and parsed.port:
                by_port.setdefault(parsed.port, []).append((route.upstream_model or name, route.kind))
    return sorted(by_port.items())


def demo_policy(asked: str, data_dir: Path) -> Path:
    """The policy `tollgate up` serves: one given by name as it is; the default as a copy in the data directory,
    made once (so PUT /admin/policy and an admin's edits change the copy, never the tracked file, and outlive a
    restart; delete it to start afresh)."""
    policy = _policy_path(asked)
    if asked != DEFAULT_POLICY:
        return policy
    copy = data_dir / "policy.yaml"
    if not copy.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(policy.read_bytes())
    return copy


def demo_banner(url: str, workers: int, policy: Path) -> str:
    """What a newcomer needs: the endpoint, every demo token the policy still holds, the finance page."""
    from gateway.auth import hash_key
    from gateway.policy.loader import load_file

    p = load_file(policy).policy
    held = {*(k for t in p.tenants.values() for k in t.keys), p.server.admin_token_sha256,
            p.server.finance_token_sha256}
    tokens = [f"  {label}: {token}" for label, token in DEMO_TOKENS if "sha256:" + hash_key(token) in held]
    key = DEMO_KEY if "sha256:" + hash_key(DEMO_KEY) in held else "<a tenant key>"
    lines = [f"Tollgate is up at {url}/v1 with {workers} simulated worker(s); policy {policy}"]
    if tokens:
        lines += ["Demo tokens (change them before anything real):", *tokens]
    lines += [f"Finance page: {url}/reports (sign in with the finance or admin token)",
              f"Try: curl {url}/v1/chat/completions -H 'Authorization: Bearer {key}' "
              "-H 'Content-Type: application/json' "
              "-d '{\"model\":\"sim-llama-8b\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}'",
              "Ctrl-C stops the gateway and its workers."]
    return "\n".join(lines)


def cmd_up(args: argparse.Namespace) -> None:
    """Simulated workers for every local worker URL in the policy, then the gateway; Ctrl-C stops all."""
    policy = demo_policy(args.policy, Path(args.data_dir))
    try:
        workers = local_workers(policy)
    except Exception as exc:  # a bad policy: say so plainly
        sys.exit(f"tollgate: {policy}: {exc}")
    children: list[subprocess.Popen[bytes]] = []

    def terminate(signum: int, frame: object) -> None:
        # uvicorn re-raises SIGTERM after its own shutdown; exit through `finally` so the workers stop too
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, terminate)
    try:
        for port, models in workers:
            if len(set(models)) > 1:
                sys.exit(f"tollgate: worker port {port} serves several models {models}; the simulator serves one")
            if _port_in_use(port):
                sys.exit(f"tollgate: port {port} (a worker in {policy}) is already in use; stop what holds it "
                         "or change the policy")
            (model, kind), = set(models)
            children.append(subprocess.Popen(
                [sys.executable, "-m", "workers.sim", "--port", str(port), "--model", model,
                 "--runner", "pooling" if kind == "embed" else "generate"], start_new_session=True))
        deadline = time.monotonic() + 15
        for child, (port, _) in zip(children, workers, strict=True):
            while True:
                if child.poll() is not None:
                    sys.exit(f"tollgate: the simulated worker on port {port} exited with {child.returncode}")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    sys.exit(f"tollgate: the simulated worker on port {port} did not start")
                time.sleep(0.1)
        banner = demo_banner(f"http://{args.host}:{args.port}", len(workers), policy)
        _serve(policy, args.host, args.port, Path(args.data_dir), banner)
    finally:
        for child in children:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
        for child in children:
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def cmd_policy_check(args: argparse.Namespace) -> None:
    from gateway.policy.loader import PolicyError, load_file

    try:
        snapshot = load_file(Path(args.file))
    except PolicyError as exc:
        for path, message in exc.errors:
            print(f"{path}: {message}", file=sys.stderr)
        sys.exit(1)
    p = snapshot.policy
    print(f"{args.file}: OK ({len(p.tenants)} tenants, {len(p.models)} models, {len(p.pools)} pools; "
          f"digest {snapshot.digest})")


def cmd_costs(args: argparse.Namespace) -> None:
    """Spend by the chosen groups, from a running gateway's report API (finance or admin token)."""
    token = args.token or os.environ.get("TOLLGATE_FINANCE_TOKEN") or os.environ.get("TOLLGATE_ADMIN_TOKEN")
    if not token:
        sys.exit("tollgate costs: give --token or set TOLLGATE_FINANCE_TOKEN")
    group_by = args.group_by or ("tenant" if args.gpu else "tenant,model")
    params = {"group_by": group_by, "format": "csv" if args.csv else "json"}
    params |= {k: v for k, v in (("from", args.start), ("to", args.end), ("tenant", args.tenant),
                                 ("month", args.month)) if v}
    path = "/admin/reports/gpu" if args.gpu else "/admin/reports/costs"
    try:
        response = httpx.get(args.url.rstrip("/") + path, params=params,
                             headers={"Authorization": f"Bearer {token}"}, timeout=60)
    except httpx.HTTPError as exc:
        sys.exit(f"tollgate costs: {args.url} did not answer: {exc}")
    if response.status_code != 200:
        sys.exit(f"tollgate costs: HTTP {response.status_code}: {response.text[:500]}")
    if args.csv:
        sys.stdout.write(response.text)
        return
    from rich.console import Console
    from rich.table import Table

    report = response.json()
    if args.gpu:
        _print_gpu(report)
        return
    keys = ["key_id" if g == "key" else g for g in report["group_by"]]
    table = Table(title=f"Costs {(report['from'] or 'the start')[:10]} .. {(report['to'] or 'now')[:10]}",
                  padding=(0, 1), collapse_padding=True)
    # short headers that wrap, and cells that fold rather than end in "...": every column stays readable in an
    # 80-column terminal (rich otherwise cut them to a letter or two)
    headers = {"requests": "requests", "prompt_tokens": "prompt\ntokens", "completion_tokens": "output\ntokens",
               "cache_hits": "cache\nhits", "cost_usd": "cost\nUSD", "cost_per_1k_requests_usd": "USD per\n1k req"}
    columns = [*keys, *headers]
    for name in columns:
        table.add_column(headers.get(name, name), justify="left" if name in keys else "right", overflow="fold")
    for row in [*report["data"], {**report["total"], **dict.fromkeys(keys[:1], "TOTAL")}]:
        table.add_row(*(f"{row.get(c, ''):.6f}" if c.endswith("usd") else str(row.get(c, "")) for c in columns))
    Console().print(table)


def _print_gpu(report: dict[str, Any]) -> None:
    """The GPU report as three tables: the groups (idle rows apart), the workers' hours, the cheapest line."""
    from rich.console import Console
    from rich.table import Table

    from gateway.ledger.prices import plain

    console = Console()
    keys = list(dict.fromkeys([*report["group_by"], "worker"]))
    table = Table(title=f"GPU cost {report['from'][:10]} .. {report['to'][:10]}", padding=(0, 1),
                  collapse_padding=True)
    headers = {"requests": "requests", "gpu_seconds": "GPU\nseconds", "gpu_cost_usd": "GPU\nUSD",
               "gpu_cost_per_1k_requests": "GPU USD\nper 1k req", "list_cost_usd": "list\nUSD"}
    for name in [*keys, *headers]:
        table.add_column(headers.get(name, name), justify="left" if name in keys else "right", overflow="fold")
    for row in report["data"]:
        cells = [str(row.get(k) or ("" if k == "worker" else "-")) for k in keys]
        for name in headers:
            value = row.get(name)
            cells.append("-" if value is None else plain(value) if name != "requests" else str(value))
        table.add_row(*cells)
    console.print(table)
    workers = Table(title="Workers", padding=(0, 1), collapse_padding=True)
    for name in ("worker", "USD/h", "hours", "busy", "idle", "util", "USD", "idle USD"):
        workers.add_column(name, justify="left" if name == "worker" else "right", overflow="fold")
    for w in report["workers"]:
        workers.add_row(w["worker"], "-" if w["usd_per_hour"] is None else plain(w["usd_per_hour"]),
                        f"{w['configured_hours']:.3f}", f"{w['busy_hours']:.3f}", f"{w['idle_hours']:.3f}",
                        f"{w['utilisation'] * 100:.1f}%", plain(w["cost_usd"]), plain(w["idle_cost_usd"]))
    console.print(workers)
    r = report["reconciliation"]
    console.print(f"tenants {plain(r['attributed_usd'])} + idle {plain(r['idle_usd'])} = workers' hours x rate "
                  f"{plain(r['workers_cost_usd'])} USD")
    for p in report["cheapest"]:
        console.print(f"cheapest for {p['pool']}: ran {p['workers_ran']:.2f} workers for {plain(p['cost_ran_usd'])} "
                      f"USD; the scaling rules would have run {p['workers_needed']:.2f} for "
                      f"{plain(p['cost_needed_usd'])} USD ({'met' if p['meets_slo'] else 'missed'} the TTFT SLO)")


def cmd_diagnose(args: argparse.Namespace) -> None:
    """The sources' latency checklist against a running gateway; exit 1 when it finds a problem."""
    import asyncio

    from gateway.ops import diagnose

    model = args.model
    if model is None:
        try:
            listed = httpx.get(args.url.rstrip("/") + "/v1/models", headers={"Authorization": f"Bearer {args.key}"},
                               timeout=10).json()["data"]
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            sys.exit(f"tollgate diagnose: cannot list models at {args.url} ({exc}); give --model")
        if not listed:
            sys.exit("tollgate diagnose: the key may use no model; give --model")
        model = listed[0]["id"]
    report = asyncio.run(diagnose.run(args.url, args.key, model, args.direct, args.metrics_token))
    if args.json:
        print(json.dumps([f.__dict__ for f in report.findings], indent=2))
    else:
        print(report.text())
    sys.exit(1 if report.problems else 0)


def cmd_keys_new(args: argparse.Namespace) -> None:
    from gateway.auth import hash_key, new_key

    key = new_key()
    print(f"API key for tenant '{args.tenant}' (shown once; store it now): {key}")
    print("Add this line under the tenant's `keys:` in the policy:")
    print(f'      - "sha256:{hash_key(key)}"')


def _admin_call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None,
                params: dict[str, str] | None = None) -> Any:
    """One call to a running gateway's admin API; exits with its error in plain words when it fails."""
    token = args.token or os.environ.get("TOLLGATE_ADMIN_TOKEN")
    if not token:
        sys.exit(f"tollgate keys {args.keys_command}: give --token or set TOLLGATE_ADMIN_TOKEN")
    try:
        response = httpx.request(method, args.url.rstrip("/") + path, json=body, params=params,
                                 headers={"Authorization": f"Bearer {token}"}, timeout=30)
    except httpx.HTTPError as exc:
        sys.exit(f"tollgate keys {args.keys_command}: {args.url} did not answer: {exc}")
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        sys.exit(f"tollgate keys {args.keys_command}: HTTP {response.status_code}: {message}")
    return response.json()


def _seconds(text: str) -> float:
    """A duration: seconds, or a number with s, m, h or d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90, 15m, 24h, 7d)") from None


def _print_key(record: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(record, indent=2))
        return
    if "key" in record:
        print(f"API key {record['id']} for tenant '{record['tenant']}' (shown once; store it now): {record['key']}")
    if record.get("previous"):
        old = record["previous"]
        print(f"{old['id']} still works until {old['expires_at']}, then stops.")
    if "key" not in record:
        print(f"{record['id']}: {record['status']}" + (f", expires {record['expires_at']}" if record["expires_at"]
                                                      else ""))


def cmd_keys_create(args: argparse.Namespace) -> None:
    body: dict[str, Any] = {"tenant": args.tenant, "name": args.name or ""}
    if args.expires_at:
        body["expires_at"] = args.expires_at
    if args.expires_in is not None:
        body["expires_in_s"] = args.expires_in
    if args.budget_usd is not None:
        body["budget"] = {"period": args.budget_period, "limit_usd": args.budget_usd}
    if args.rpm or args.tpm:
        body["rate_limit"] = {"requests_per_minute": args.rpm, "tokens_per_minute": args.tpm}
    if args.models:
        body["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
    _print_key(_admin_call(args, "POST", "/admin/keys", body), args.json)


def cmd_keys_list(args: argparse.Namespace) -> None:
    keys = _admin_call(args, "GET", "/admin/keys", params={"tenant": args.tenant} if args.tenant else None)["data"]
    if args.json:
        print(json.dumps(keys, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Runtime API keys", padding=(0, 1), collapse_padding=True)
    columns = ("id", "tenant", "name", "status", "created_at", "created_by", "expires_at")
    for name in columns:
        table.add_column(name, overflow="fold")
    for key in keys:
        table.add_row(*(str(key.get(c) or "") for c in columns))
    Console().print(table)


def cmd_keys_revoke(args: argparse.Namespace) -> None:
    _print_key(_admin_call(args, "POST", f"/admin/keys/{args.id}/revoke"), args.json)


def cmd_keys_rotate(args: argparse.Namespace) -> None:
    _print_key(_admin_call(args, "POST", f"/admin/keys/{args.id}/rotate", {"grace_s": args.grace}), args.json)


def cmd_keys_expire(args: argparse.Namespace) -> None:
    if args.never:
        body: dict[str, Any] = {"expires_at": None}
    elif args.at:
        body = {"expires_at": args.at}
    else:
        body = {"expires_in_s": args.expires_in}
    _print_key(_admin_call(args, "PATCH", f"/admin/keys/{args.id}", body), args.json)


def cmd_worker_render(args: argparse.Namespace) -> None:
    from gateway.policy.loader import PolicyError, load_file
    from workers.vllm.render import container_args, shell_command

    try:
        policy = load_file(_policy_path(args.policy)).policy
    except PolicyError as exc:
        sys.exit(f"tollgate: {args.policy} is not a valid policy:\n{exc}")
    spec = policy.workers.get(args.name)
    if spec is None:
        sys.exit(f"tollgate: no worker '{args.name}' under workers: (have: {', '.join(policy.workers) or 'none'})")
    print(shell_command(spec) if args.format == "shell" else json.dumps(container_args(spec), indent=2))


def cmd_cache_eval(args: argparse.Namespace) -> None:
    from gateway.cache.evaluate import EMBEDDERS, GPTCACHE, PAIRS, PAIRS_KO, report

    embedders = EMBEDDERS if args.embedder == "all" else (args.embedder,)
    pair_files = [Path(p) for p in args.pairs] if args.pairs else [PAIRS, PAIRS_KO]
    data = None if args.data == "" else Path(args.data or GPTCACHE)
    text, results = report(args.threshold, data, pair_files, embedders)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, ensure_ascii=False))


def cmd_sim(args: argparse.Namespace) -> None:
    from workers.sim.cli import run

    run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tollgate", description="An OpenAI-compatible gateway for vLLM workers.")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="gateway + simulated workers + the default policy, on this machine")
    up.add_argument("--policy", default=DEFAULT_POLICY)
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8080)
    up.add_argument("--data-dir", default=os.environ.get("TOLLGATE_DATA_DIR", DEFAULT_DATA_DIR),
                        help="where what must survive a restart is kept (batch files and state); "
                             "env TOLLGATE_DATA_DIR")
    up.set_defaults(func=cmd_up)

    serve = sub.add_parser("serve", help="run the gateway only")
    serve.add_argument("--policy", default=DEFAULT_POLICY)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--workers", dest="gateway_processes", metavar="N", type=int, default=1,
                       help="how many gateway processes serve this port (SO_REUSEPORT); the gateway's own "
                            "processes, not vLLM workers")
    serve.add_argument("--process-index", type=int, default=0, help=argparse.SUPPRESS)
    serve.add_argument("--processes", type=int, default=0, help=argparse.SUPPRESS)
    serve.add_argument("--data-dir", default=os.environ.get("TOLLGATE_DATA_DIR", DEFAULT_DATA_DIR),
                        help="where what must survive a restart is kept (batch files and state); "
                             "env TOLLGATE_DATA_DIR")
    serve.set_defaults(func=cmd_serve)

    from workers.sim.cli import build_parser as sim_parser
    sim = sub.add_parser("sim", help="run a simulated vLLM worker")
    sim_parser(sim)
    sim.set_defaults(func=cmd_sim)

    policy = sub.add_parser("policy", help="policy tools").add_subparsers(dest="policy_command", required=True)
    check = policy.add_parser("check", help="validate a policy file; print every error with its path")
    check.add_argument("file")
    check.set_defaults(func=cmd_policy_check)

    costs = sub.add_parser("costs", help="spend by tenant/model/day/tier/key from a running gateway")
    costs.add_argument("--url", default="http://127.0.0.1:8080")
    costs.add_argument("--token", help="finance or admin token (or env TOLLGATE_FINANCE_TOKEN)")
    costs.add_argument("--from", dest="start", help="ISO date or time (UTC)")
    costs.add_argument("--to", dest="end", help="ISO date (inclusive) or time")
    costs.add_argument("--tenant")
    costs.add_argument("--group-by", help="from tenant,model,day,tier,class,key,tag,worker (default tenant,model; "
                       "with --gpu: tenant, from tenant,model,tier,class,worker,tag,key)")
    costs.add_argument("--month", help="a calendar month, YYYY-MM (instead of --from/--to)")
    costs.add_argument("--gpu", action="store_true", help="what the GPUs cost: the workers' hours shared among "
                       "the requests they ran, idle apart")
    costs.add_argument("--csv", action="store_true", help="CSV instead of a table")
    costs.set_defaults(func=cmd_costs)

    diag = sub.add_parser("diagnose", help="where the latency goes: the sources' checklist against a gateway")
    diag.add_argument("url", help="the gateway (or the proxy in front of it)")
    diag.add_argument("--key", required=True, help="a tenant's API key")
    diag.add_argument("--direct", help="a worker's URL, to compare with and read its metrics")
    diag.add_argument("--model", help="default: the first model the key may use")
    diag.add_argument("--metrics-token", help="if the gateway's /metrics needs one")
    diag.add_argument("--json", action="store_true")
    diag.set_defaults(func=cmd_diagnose)

    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="keys_command", required=True)
    new = keys.add_parser("new", help="make a key; print it once and the hash line for the policy")
    new.add_argument("--tenant", required=True)
    new.set_defaults(func=cmd_keys_new)

    def runtime(name: str, help_text: str) -> argparse.ArgumentParser:
        """A subcommand that calls a running gateway's admin API."""
        command = keys.add_parser(name, help=help_text)
        command.add_argument("--url", default="http://127.0.0.1:8080")
        command.add_argument("--token", help="the admin token (or env TOLLGATE_ADMIN_TOKEN)")
        command.add_argument("--json", action="store_true", help="the API's answer as JSON")
        return command
    create = runtime("create", "make a key on a running gateway (stored hashed; printed once)")
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", help="a label for people")
    create.add_argument("--expires-at", help="ISO 8601 time (UTC without an offset)")
    create.add_argument("--expires-in", type=_seconds, help="a duration: 3600, 90m, 24h, 30d")
    create.add_argument("--budget-usd", type=float, help="the key's own budget, within its tenant's")
    create.add_argument("--budget-period", choices=("day", "month"), default="month")
    create.add_argument("--rpm", type=int, help="the key's own requests per minute, within its tenant's")
    create.add_argument("--tpm", type=int, help="the key's own tokens per minute, within its tenant's")
    create.add_argument("--models", help="comma-separated models the key may use, of its tenant's")
    create.set_defaults(func=cmd_keys_create)
    listing = runtime("list", "the runtime keys (never the keys themselves)")
    listing.add_argument("--tenant")
    listing.set_defaults(func=cmd_keys_list)
    revoke = runtime("revoke", "refuse a key from now on, on every replica")
    revoke.add_argument("id")
    revoke.set_defaults(func=cmd_keys_revoke)
    rotate = runtime("rotate", "a new key like this one; the old one works for a grace period, then stops")
    rotate.add_argument("id")
    rotate.add_argument("--grace", type=_seconds, default=86400.0, help="how long the old key still works "
                        "(default 24h)")
    rotate.set_defaults(func=cmd_keys_rotate)
    expire = runtime("expire", "set when a key stops working")
    expire.add_argument("id")
    when = expire.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", help="ISO 8601 time (UTC without an offset)")
    when.add_argument("--in", dest="expires_in", type=_seconds, help="a duration from now (0: now)")
    when.add_argument("--never", action="store_true", help="clear the expiry")
    expire.set_defaults(func=cmd_keys_expire)

    worker = sub.add_parser("worker", help="real vLLM workers").add_subparsers(dest="worker_command", required=True)
    render = worker.add_parser("render", help="render `vllm serve` for a worker spec in the policy")
    render.add_argument("name")
    render.add_argument("--policy", default=DEFAULT_POLICY)
    render.add_argument("--format", choices=("shell", "k8s"), default="shell")
    render.set_defaults(func=cmd_worker_render)

    cache = sub.add_parser("cache", help="response cache tools").add_subparsers(dest="cache_command", required=True)
    evaluate = cache.add_parser("eval", help="quality report: hit rate, wrong and near-miss hits, verifier on/off")
    evaluate.add_argument("--threshold", type=float, help="default: each embedder's own (the policy's default)")
    evaluate.add_argument("--embedder", choices=("e5", "minilm", "all"), default="e5",
                          help="the embedder measured (all: each in turn)")
    evaluate.add_argument("--data", help="GPTCache mock_data.json (default: loadtest/data/gptcache/mock_data.json; "
                                         "'' leaves it out)")
    evaluate.add_argument("--pairs", nargs="+", help="near-miss/paraphrase YAML files (default: "
                                                     "loadtest/data/cache_pairs.yaml and cache_pairs_ko.yaml)")
    evaluate.add_argument("--out", help="also write the figures as JSON here")
    evaluate.set_defaults(func=cmd_cache_eval)

    try:
        from loadtest.cli import add_parser as add_loadtest
    except ImportError:
        pass
    else:
        add_loadtest(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
