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
from types import FrameType
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
    cache = store.current.policy.cache
    if cache.enabled and cache.verifier:
        from gateway.cache import roles

        # the Korean analyser, loaded before the event loop serves: building it holds the interpreter's lock for
        # about two seconds, which on a thread would stall the loop (a cache enabled later by a reload loads it on
        # its first Korean question, once)
        roles.warm()
    config = uvicorn.Config(app, host=host, port=port, loop="uvloop", http=protocol_for(limits),
                            lifespan="on", access_log=False, log_level="warning",
                            timeout_keep_alive=int(max(1, server_policy.idle_timeout_s)),
                            limit_concurrency=server_policy.max_connections,
                            timeout_graceful_shutdown=int(server_policy.shutdown_grace_s),
                            proxy_headers=False, server_header=False)

    class Server(uvicorn.Server):
        """uvicorn's server, that drains on a stop signal and shows the banner once it listens."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            """SIGTERM/SIGINT: /readyz turns 503 at once; uvicorn stops accepting and lets answers in flight
            finish for server.shutdown_grace_s."""
            app.gateway.draining = True
            super().handle_exit(sig, frame)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if banner:
                print(banner, flush=True)

    server = Server(config)
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
    """What a newcomer needs: the endpoint, every demo token the policy still holds, the console and the finance
    page."""
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
    lines += [f"Console: {url}/console (keys, policy, queues, cache, audit; sign in with the admin token)",
              f"Finance page: {url}/reports (sign in with the finance or admin token)",
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
    """Spend by the chosen groups, from a running gateway's report API (the finance or admin token): this month so
    far unless a month or a range is asked for; amounts to the cent, rates to the digits they need
    (gateway.finance.money)."""
    token = args.token or os.environ.get("TOLLGATE_FINANCE_TOKEN") or os.environ.get("TOLLGATE_ADMIN_TOKEN")
    if not token:
        sys.exit("tollgate costs: give --token, or set TOLLGATE_FINANCE_TOKEN or TOLLGATE_ADMIN_TOKEN")
    group_by = args.group_by or ("tenant" if args.gpu else "tenant,model")
    params = {"group_by": group_by, "format": "csv" if args.csv else "json"}
    params |= {k: v for k, v in (("from", args.start), ("to", args.end), ("tenant", args.tenant),
                                 ("month", args.month)) if v}
    this_month = not (args.start or args.end or args.month)
    if this_month:
        params["month"] = time.strftime("%Y-%m", time.gmtime())
    path = "/admin/reports/gpu" if args.gpu else "/admin/reports/costs"
    try:
        response = httpx.get(args.url.rstrip("/") + path, params=params,
                             headers={"Authorization": f"Bearer {token}"}, timeout=60)
    except httpx.HTTPError as exc:
        sys.exit(f"tollgate costs: {args.url} did not answer ({exc}); is the gateway running there?")
    if response.status_code != 200:
        sys.exit(f"tollgate costs: {refusal(response)}")
    if args.csv:
        sys.stdout.write(response.text)
        return
    from rich.console import Console

    report = response.json()
    title = report_title(report.get("from"), report.get("to"), args.month, this_month)
    if args.gpu:
        _print_gpu(report, title)
        return
    from gateway.finance import money

    keys = ["key_id" if g == "key" else g for g in report["group_by"]]
    headers = {"requests": "requests", "prompt_tokens": "prompt\ntokens", "completion_tokens": "output\ntokens",
               "cache_hits": "cache\nhits", "cost_usd": "cost\nUSD", "cost_per_1k_requests_usd": "USD per\n1k req"}
    rows = []
    for row in [*report["data"], {**report["total"], **dict.fromkeys(keys[:1], "TOTAL")}]:
        cells = [str(row.get(k) if row.get(k) is not None else "-") for k in keys]
        cells += [money.amount(row.get("cost_usd")) if c == "cost_usd" else
                  money.rate(row.get(c)) if c == "cost_per_1k_requests_usd" else str(row.get(c, "")) for c in headers]
        rows.append(cells)
    Console().print(fitted(f"Costs, {title}", keys, list(headers.values()), rows, Console().width))


def refusal(response: httpx.Response) -> str:
    """A gateway's error answer in words: what it said, and what to do about a token it did not take."""
    try:
        error = response.json()["error"]
        message = str(error["message"])
    except (ValueError, KeyError, TypeError):
        message = response.text[:300].strip() or response.reason_phrase
    if response.status_code == 401:
        return f"the gateway did not accept the token ({message}). Give a finance or admin token."
    if response.status_code == 403:
        return f"the token may not read this ({message})."
    if response.status_code == 503:
        return f"the gateway is busy or its ledger is unreachable ({message}); try again in a few seconds."
    return f"the gateway refused the request (HTTP {response.status_code}): {message}"


def report_title(start: str | None, end: str | None, month: str | None, this_month: bool) -> str:
    """A report's period in words: "this month so far: 2026-12-01 to now", "month 2026-11: 2026-11-01 to
    2026-11-30", "2026-11-03 to 2026-11-20" (the last day inclusive), "everything up to 2026-11-20"."""
    from datetime import datetime, timedelta

    def day(text: str) -> str:
        return text[:10]

    def last(text: str) -> str:  # an exclusive end as the last day it covers
        moment = datetime.fromisoformat(text)
        return (moment - timedelta(microseconds=1)).date().isoformat()

    now = time.time()
    future = end is not None and datetime.fromisoformat(end).timestamp() > now
    if this_month and start:
        return f"this month so far: {day(start)} to now"
    if month and start and end:
        return f"month {month}: {day(start)} to {'now' if future else last(end)}"
    if start and end:
        return f"{day(start)} to {'now' if future else last(end)}"
    if start:
        return f"{day(start)} to now"
    if end:
        return f"everything up to {last(end)}"
    return "everything the ledger holds"


def fitted(title: str, keys: list[str], headers: list[str], rows: list[list[str]], width: int,
           numbers: bool = True) -> Any:
    """``rows`` as tables that fit ``width`` columns without splitting a value: a value never wraps nor is cut;
    when all the columns do not fit, the value columns are shared among several tables, each repeating the group
    columns (``keys``, the first cells of each row). A header wraps only where it holds a line break; ``numbers``:
    the value columns are right-aligned."""
    from rich.console import Group
    from rich.table import Table

    names = [*keys, *headers]

    def need(column: int) -> int:
        return max([*(len(line) for line in names[column].split("\n")), *(len(r[column]) for r in rows)]) + 3

    fixed = 1 + sum(need(i) for i in range(len(keys)))
    if fixed + max((need(c) for c in range(len(keys), len(names))), default=0) > width:
        return _records(title, names, rows)  # not even the group columns and one more fit: a row per block
    groups: list[list[int]] = [[]]
    used = fixed
    for column in range(len(keys), len(names)):
        if groups[-1] and used + need(column) > width:
            groups.append([])
            used = fixed
        groups[-1].append(column)
        used += need(column)
    tables = []
    for n, group in enumerate(groups):
        table = Table(title=title if n == 0 else None, padding=(0, 1), title_justify="left")
        for column in [*range(len(keys)), *group]:
            table.add_column(names[column], justify="right" if numbers and column >= len(keys) else "left",
                             no_wrap=True,
                             overflow="fold")
        for row in rows:
            table.add_row(*(shown(row[c]) for c in [*range(len(keys)), *group]))
        tables.append(table)
    return Group(*tables)


def _records(title: str, names: list[str], rows: list[list[str]]) -> Any:
    """``rows`` as blocks of "name: value" lines, for a terminal too narrow for any table of them: a value is
    never cut, and one wider than the terminal wraps as the terminal wraps it."""
    from rich.console import Group
    from rich.text import Text

    lines: list[Any] = [Text(title)]
    for row in rows:
        lines.append(Text(""))
        lines += [Text.assemble(name.replace("\n", " ") + ": ", shown(value)) for name, value in zip(names, row,
                                                                                                     strict=True)]
    return Group(*lines)


def _print_gpu(report: dict[str, Any], title: str) -> None:
    """The GPU report as three tables: the groups (idle rows apart), the workers' hours, the cheapest line."""
    from rich.console import Console

    from gateway.finance import money

    console = Console()
    keys = list(dict.fromkeys([*report["group_by"], "worker"]))
    headers = {"requests": "requests", "gpu_seconds": "GPU\nseconds", "gpu_cost_usd": "GPU\nUSD",
               "gpu_cost_per_1k_requests": "GPU USD\nper 1k req", "list_cost_usd": "list\nUSD"}
    rows = []
    for row in report["data"]:
        cells = [str(row.get(k) or ("" if k == "worker" else "-")) for k in keys]
        for name in headers:
            value = row.get(name)
            cells.append("-" if value is None else str(value) if name == "requests" else
                         f"{value:.1f}" if name == "gpu_seconds" else
                         money.rate(value) if name == "gpu_cost_per_1k_requests" else money.amount(value))
        rows.append(cells)
    console.print(fitted(f"GPU cost, {title}", keys, list(headers.values()), rows, console.width))
    if "workers" not in report:  # one tenant's report: its own rows, nothing of the fleet's
        return
    workers = [[w["worker"], money.rate(w["usd_per_hour"]), f"{w['configured_hours']:.3f}",
                f"{w['busy_hours']:.3f}", f"{w['idle_hours']:.3f}", f"{w['utilisation'] * 100:.1f}%",
                money.amount(w["cost_usd"]), money.amount(w["idle_cost_usd"])] for w in report["workers"]]
    console.print(fitted("Workers", ["worker"], ["USD/h", "hours", "busy", "idle", "util", "USD", "idle USD"],
                         workers, console.width))
    r = report["reconciliation"]
    console.print(shown(f"tenants {money.amount(r['attributed_usd'])} + idle {money.amount(r['idle_usd'])} = "
                        f"workers' hours x rate {money.amount(r['workers_cost_usd'])} USD"))
    for p in report["cheapest"]:
        console.print(shown(f"cheapest for {p['pool']}: ran {p['workers_ran']:.2f} workers for "
                            f"{money.amount(p['cost_ran_usd'])} USD; the scaling rules would have run "
                            f"{p['workers_needed']:.2f} for {money.amount(p['cost_needed_usd'])} USD "
                            f"({'met' if p['meets_slo'] else 'missed'} the TTFT SLO)"))


def shown(value: object) -> Any:
    """A value as rich shows it literally: a ``Text``, never console markup (a key named ``[/]`` would end every
    later listing in a MarkupError, one named ``[link=...]`` would become a hyperlink), with each character that
    can hide or reorder what a terminal shows (controls, bidi overrides, separators: gateway.keys.model's
    UNSAFE_TEXT; a name stored before they were refused) written as its escape, e.g. ``\\u202e``."""
    from rich.text import Text

    from gateway.keys.model import UNSAFE_TEXT

    text = "" if value is None else str(value)
    return Text(UNSAFE_TEXT.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


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
                params: dict[str, Any] | None = None, content: bytes | None = None) -> Any:
    """One call to a running gateway's admin API; exits with its error in plain words when it fails (a refused
    policy: each problem on a line of its own, with its path and line)."""
    what = f"tollgate {args.command_label}"
    token = args.token or os.environ.get("TOLLGATE_ADMIN_TOKEN")
    if not token:
        sys.exit(f"{what}: give --token or set TOLLGATE_ADMIN_TOKEN")
    try:
        response = httpx.request(method, args.url.rstrip("/") + path, json=body, params=params, content=content,
                                 headers={"Authorization": f"Bearer {token}"}, timeout=60)
    except httpx.HTTPError as exc:
        sys.exit(f"{what}: {args.url} did not answer: {exc}")
    if response.status_code >= 400:
        try:
            error = response.json()["error"]
            message = error["message"] + "".join(f"\n  {d['path']}: {d['message']}" for d in error.get("details") or [])
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        sys.exit(f"{what}: HTTP {response.status_code}: {message}")
    return response.json() if "json" in response.headers.get("content-type", "") else response.text


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
    keys: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 1000, **({"tenant": args.tenant} if args.tenant else {})}
    while True:  # every page, newest first
        page = _admin_call(args, "GET", "/admin/keys", params=params)
        keys += page["data"]
        if not page.get("has_more") or not page["data"]:
            break
        params["after"] = page["data"][-1]["id"]
    if args.json:
        print(json.dumps(keys, indent=2))
        return
    from rich.console import Console

    Console().print(keys_table(keys))


def keys_table(keys: list[dict[str, Any]], width: int = 0) -> Any:
    """The runtime keys as rich tables that fit ``width`` columns (the terminal's when 0) without splitting a
    value, every cell literal text (``shown``): each key's name, tenant, status, budget, limits and models."""
    from rich.console import Console

    from gateway.finance import money

    def budget(key: dict[str, Any]) -> str:
        b = key.get("budget")
        return f"{money.amount(b['limit_usd'])} USD/{b['period']}" if b else "-"

    def limits(key: dict[str, Any]) -> str:
        r = key.get("rate_limit") or {}
        parts = [f"{r[k]} {unit}" for k, unit in (("requests_per_minute", "rpm"), ("tokens_per_minute", "tpm"))
                 if r.get(k)]
        return ", ".join(parts) or "-"

    rows = [[str(k.get("id") or ""), str(k.get("name") or ""), str(k.get("tenant") or ""), str(k.get("status") or ""),
             budget(k), limits(k), ",".join(k["models"]) if k.get("models") else "(tenant's)",
             str(k.get("created_at") or ""), str(k.get("created_by") or ""), str(k.get("expires_at") or "never")]
            for k in keys]
    return fitted("Runtime API keys", ["id", "name"], ["tenant", "status", "budget", "limits", "models", "created",
                                                        "created by", "expires"], rows, width or Console().width,
                  numbers=False)


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


def cmd_policy_get(args: argparse.Namespace) -> None:
    print(_admin_call(args, "GET", "/admin/policy", params={"format": "yaml"}), end="")


def cmd_policy_push(args: argparse.Namespace) -> None:
    """diff (a dry run) or apply: the file sent as it is; what changes (or would), path by path."""
    text = Path(args.file).read_bytes()
    dry = args.policy_command == "diff"
    answer = _admin_call(args, "PUT", "/admin/policy", params={"dry_run": "true"} if dry else None, content=text)
    if args.json:
        print(json.dumps(answer, indent=2))
        return
    changes = answer["changes"]
    verb = "would change" if dry else "changed"
    print(f"{len(changes) if changes else 'nothing'} {'path' if len(changes) == 1 else 'paths'} {verb}"
          + (f" (of {answer['changes_total']})" if answer["changes_total"] > len(changes) else "")
          + ("" if dry else f"; live digest {answer['digest'][:12]}"))
    _print_changes(changes)


def cmd_policy_history(args: argparse.Namespace) -> None:
    entries = _admin_call(args, "GET", "/admin/audit", params={"action": "policy", "limit": args.limit})["data"]
    if args.json:
        print(json.dumps(entries, indent=2))
        return
    from rich.console import Console

    rows = [[e["id"], e["time"][:19].replace("T", " "), e["action"], e["actor"],
             _summary(e["details"])] for e in entries]
    Console().print(fitted("Policy changes, newest first", ["entry"], ["time (UTC)", "action", "by", "paths"], rows,
                           Console().width, numbers=False))
    print("Undo one: tollgate policy rollback <entry>")


def cmd_policy_rollback(args: argparse.Namespace) -> None:
    answer = _admin_call(args, "POST", "/admin/policy/rollback", {"entry": args.entry})
    if args.json:
        print(json.dumps(answer, indent=2))
        return
    print(f"rolled back; live digest {answer['digest'][:12]}")
    _print_changes(answer["changes"])


def cmd_audit(args: argparse.Namespace) -> None:
    params = {k: v for k, v in (("action", args.action), ("from", args.start), ("to", args.end),
                                ("limit", args.limit)) if v}
    entries = _admin_call(args, "GET", "/admin/audit", params=params)["data"]
    if args.json:
        print(json.dumps(entries, indent=2))
        return
    from rich.console import Console

    rows = [[e["time"][:19].replace("T", " "), e["action"], e["actor"], e.get("client") or "-",
             e.get("target") or "-", _summary(e["details"])] for e in entries]
    Console().print(fitted("The audit log, newest first", ["time (UTC)"], ["action", "by", "client", "target",
                                                                           "what"], rows, Console().width,
                           numbers=False))


def _summary(details: dict[str, Any]) -> str:
    if "changes" in details:
        paths = [c["path"] for c in details["changes"]]
        return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "") or "-"
    if "errors" in details:
        return "refused: " + ", ".join(details["errors"][:3])
    return ", ".join(f"{k}={v}" for k, v in details.items() if isinstance(v, str | int | float))[:80] or "-"


def _print_changes(changes: list[dict[str, Any]]) -> None:
    from rich.console import Console

    if not changes:
        return

    def shown(value: Any) -> str:
        return "-" if value is None else value if isinstance(value, str) else json.dumps(value)

    rows = [[c["path"], c["change"], shown(c.get("old")), shown(c.get("new"))] for c in changes]
    Console().print(fitted("Changes", ["path"], ["change", "old", "new"], rows, Console().width, numbers=False))


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
    from loadtest.benchmarks.cache.cache_eval import run

    run(args)


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

    def admin_api(parent: Any, name: str, help_text: str) -> argparse.ArgumentParser:
        """A subcommand that calls a running gateway's admin API."""
        command: argparse.ArgumentParser = parent.add_parser(name, help=help_text)
        command.add_argument("--url", default="http://127.0.0.1:8080")
        command.add_argument("--token", help="the admin token (or env TOLLGATE_ADMIN_TOKEN)")
        command.add_argument("--json", action="store_true", help="the API's answer as JSON")
        return command
    admin_api(policy, "get", "the live policy of a running gateway, as YAML (secrets redacted)").set_defaults(
        func=cmd_policy_get)
    for name, help_text in (("diff", "what a policy file would change on a running gateway (a dry run)"),
                            ("apply", "make a policy file live on a running gateway (audited)")):
        push = admin_api(policy, name, help_text)
        push.add_argument("file", help="YAML or JSON; <redacted> values, as `policy get` shows them, keep the "
                          "live ones")
        push.set_defaults(func=cmd_policy_push)
    history = admin_api(policy, "history", "the policy's changes from the audit log, newest first")
    history.add_argument("--limit", type=int, default=20)
    history.set_defaults(func=cmd_policy_history)
    rollback = admin_api(policy, "rollback", "undo one change (an entry of `policy history`) on the live policy")
    rollback.add_argument("entry")
    rollback.set_defaults(func=cmd_policy_rollback)
    audit = admin_api(sub, "audit", "the audit log of a running gateway: who changed what, when, from where")
    audit.add_argument("--action", help="an action or its first part: policy, key, cache, statement ...")
    audit.add_argument("--from", dest="start", help="ISO date or time (UTC)")
    audit.add_argument("--to", dest="end", help="ISO date (inclusive) or time")
    audit.add_argument("--limit", type=int, default=50)
    audit.set_defaults(func=cmd_audit)

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
        return admin_api(keys, name, help_text)
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
    try:
        from loadtest.benchmarks.cache.cache_eval import add_arguments as eval_arguments
        eval_arguments(evaluate)
    except ImportError:  # an install without the loadtest package: the command says so when run
        pass
    evaluate.set_defaults(func=cmd_cache_eval)

    try:
        from loadtest.harness.cli import add_parser as add_loadtest
    except ImportError:
        pass
    else:
        add_loadtest(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sub = getattr(args, f"{args.command}_command", None)
    args.command_label = f"{args.command} {sub}" if sub else args.command  # for its messages
    try:
        args.func(args)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
