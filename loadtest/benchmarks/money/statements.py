"""Finance reads over an ordinary month: what each statement and report costs the gateway while it is built
(python -m loadtest run statements).

A gateway whose ledger holds a month of records (200,000 by default, 20,000 end users each with a ``user`` tag,
spread over the policy's three tenants), a simulated worker for readiness, and each finance read asked for in
turn: the month's statement as JSON, the printable page, CSV and the workbook; the cost report by tenant, by
cost centre (a row per end user) and by day, tenant and model, as JSON and CSV; the GPU report by tenant and by
cost centre; the finance page for the month and one tenant's drill-down; every record (the ledger export,
streamed page by page, for comparison: it is no build); and two workbooks asked for at once. Throughout,
/healthz is asked every ``--probe-ms`` over one keep-alive connection. Reported per read: its status, seconds and
bytes; /healthz p50, p99 and worst while it ran, and how many answered; the gateway's peak RSS over its RSS
before (VmHWM, reset before each read through /proc/PID/clear_refs) and its RSS ``--settle-s`` after the answer,
against before; and the machine's load average before and after (the machine may be shared).

Goals (issue 43): /healthz p99 under 50 ms, peak RSS at most +128 MB, RSS after back within 32 MB of before.
The gateway runs alone on CPU 1 when the machine has two (``--no-pin``: wherever the kernel puts it); this
process and the worker share CPU 0.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from loadtest.harness import procs
from loadtest.harness.fixtures import FINANCE_TOKEN
from loadtest.harness.ledger import seed_month
from loadtest.harness.policy import build_policy
from loadtest.harness.stats import percentile

FINANCE = {"Authorization": f"Bearer {FINANCE_TOKEN}"}


def rss_kib(pid: int, field_name: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise KeyError(field_name)


class Prober(threading.Thread):
    """GET /healthz every ``every_s`` over one keep-alive connection: (sent, seconds) of each answer."""

    def __init__(self, url: str, every_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.every_s = url, every_s
        self.answers: list[tuple[float, float]] = []
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self.stop.wait(self.every_s):
                sent = time.monotonic()
                try:
                    ok = client.get(self.url + "/healthz").status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    self.answers.append((sent, time.monotonic() - sent))
                else:
                    self.failures += 1

    def during(self, start: float, end: float) -> list[float]:
        """Latencies (ms) of the answers to requests sent in [start, end)."""
        return [seconds * 1000 for sent, seconds in list(self.answers) if start <= sent < end]


def fetch(url: str, params: dict[str, str]) -> tuple[int, int, str | None]:
    """(status, bytes, Retry-After) of one finance read, its answer read to the end."""
    size = 0
    with httpx.Client(timeout=600) as client, client.stream("GET", url, params=params, headers=FINANCE) as answer:
        for chunk in answer.iter_bytes():
            size += len(chunk)
    return answer.status_code, size, answer.headers.get("retry-after")


def read(gateway: procs.Proc, prober: Prober, name: str, path: str, params: dict[str, str], settle_s: float,
         at_once: int = 1) -> dict[str, Any]:
    """One finance read (``at_once`` of it together, from as many threads), measured: the answers read to the
    end, then ``settle_s`` for the process to give back what it will."""
    pid = gateway.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM back to the RSS now
    before = rss_kib(pid)
    start = time.monotonic()
    answers: list[tuple[int, int, str | None]] = []
    threads = [threading.Thread(target=lambda: answers.append(fetch(gateway.url + path, params)))
               for _ in range(at_once)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - start
    peak = rss_kib(pid, "VmHWM")
    time.sleep(settle_s)
    after = rss_kib(pid)
    probes = prober.during(start, start + seconds)
    answers.sort()
    status = "+".join(str(code) + (f" (Retry-After {retry})" if retry else "") for code, _, retry in answers)
    size = max(n for _, n, _ in answers)
    return {"read": name, "status": status, "seconds": round(seconds, 2), "bytes": size,
            "healthz_answers": len(probes),
            "healthz_p50_ms": round(percentile(probes, 50) or 0, 1) if probes else None,
            "healthz_p99_ms": round(percentile(probes, 99) or 0, 1) if probes else None,
            "healthz_max_ms": round(max(probes), 1) if probes else None,
            "rss_before_mib": round(before / 1024, 1), "peak_delta_mib": round((peak - before) / 1024, 1),
            "after_delta_mib": round((after - before) / 1024, 1)}


def reads(month: str) -> list[tuple[str, str, dict[str, str], int]]:
    """(name, path, parameters, how many at once) of each read."""
    m = {"month": month}
    return [(name, path, params, 1) for name, path, params in [
        ("statement json", "/admin/statements", {**m, "format": "json"}),
        ("statement html", "/admin/statements", {**m, "format": "html"}),
        ("statement csv", "/admin/statements", {**m, "format": "csv"}),
        ("statement xlsx", "/admin/statements", {**m, "format": "xlsx"}),
        ("statement xlsx, one tenant", "/admin/statements", {**m, "format": "xlsx", "tenant": "demo"}),
        ("costs by tenant json", "/admin/reports/costs", {**m, "group_by": "tenant"}),
        ("costs by tag json", "/admin/reports/costs", {**m, "group_by": "tag"}),
        ("costs by tag csv", "/admin/reports/costs", {**m, "group_by": "tag", "format": "csv"}),
        ("costs by tenant,tag csv", "/admin/reports/costs", {**m, "group_by": "tenant,tag", "format": "csv"}),
        ("costs by day,tenant,model csv", "/admin/reports/costs", {**m, "group_by": "day,tenant,model",
                                                                   "format": "csv"}),
        ("gpu by tenant json", "/admin/reports/gpu", {**m, "group_by": "tenant"}),
        ("gpu by tenant,tag csv", "/admin/reports/gpu", {**m, "group_by": "tenant,tag", "format": "csv"}),
        ("finance page", "/reports", m),
        ("finance page, one tenant", "/reports", {**m, "tenant": "demo"}),
        ("ledger export csv (streamed, no build)", "/admin/ledger", {**m, "format": "csv"}),
    ]] + [("two statement xlsx at once", "/admin/statements", {**m, "format": "xlsx"}, 2)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-statements-"))
    pin = (os.cpu_count() or 1) >= 2 and not args.no_pin
    this_month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    first = (this_month - timedelta(days=1)).replace(day=1)
    month = first.strftime("%Y-%m")
    data_dir = tmp / "data"
    data_dir.mkdir()
    started: list[procs.Proc] = []
    prober: Prober | None = None
    try:
        sim = procs.start_sim(tmp, cpu=0 if pin else None)
        started.append(sim)
        began = time.monotonic()
        seed_month(data_dir / "ledger.sqlite3", first, args.records, args.users, sim.url, args.seed)
        seeded_s = time.monotonic() - began
        gateway = procs.start_gateway(tmp, build_policy([sim.url], gpu_usd_per_hour=36.0), data_dir=data_dir,
                                      cpu=1 if pin else None)
        started.append(gateway)
        prober = Prober(gateway.url, args.probe_ms / 1000)
        prober.start()
        time.sleep(args.settle_s)  # the gateway's first moments (imports, first scrapes) out of the first read
        idle_before = time.monotonic()
        time.sleep(args.settle_s)
        idle = prober.during(idle_before, time.monotonic())
        load = os.getloadavg()
        rows = [read(gateway, prober, name, path, params, args.settle_s, at_once)
                for name, path, params, at_once in reads(month) if name.startswith(args.only or "")
                for _ in range(args.repeat)]
    finally:
        if prober is not None:
            prober.stop.set()
            prober.join()
        for proc in started:
            proc.stop()
    return {"records": args.records, "users": args.users, "month": month, "seeded_s": round(seeded_s, 1),
            "load_average_before": [round(x, 2) for x in load],
            "load_average_after": [round(x, 2) for x in os.getloadavg()], "pinned": pin, "probe_ms": args.probe_ms,
            "settle_s": args.settle_s,
            "healthz_idle_p99_ms": round(percentile(idle, 99) or 0, 1) if idle else None,
            "probe_failures": prober.failures if prober else None, "reads": rows}


def table(result: dict[str, Any]) -> str:
    head = ("| read | status | s | bytes | /healthz answers | p50 ms | p99 ms | max ms | RSS before MiB | peak + MiB "
            "| after + MiB |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['read']} | {r['status']} | {r['seconds']} | {r['bytes']:,} | {r['healthz_answers']} | "
        f"{r['healthz_p50_ms']} | {r['healthz_p99_ms']} | {r['healthz_max_ms']} | {r['rss_before_mib']} | "
        f"{r['peak_delta_mib']} | {r['after_delta_mib']} |\n" for r in result["reads"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=1, help="each read this many times in a row")
    parser.add_argument("--probe-ms", type=float, default=10.0, help="gap between /healthz probes")
    parser.add_argument("--settle-s", type=float, default=3.0, help="wait after each answer before RSS after")
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--only", help="only the reads whose names start with this")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args()
    result = run(args)
    print(json.dumps({k: v for k, v in result.items() if k != "reads"}, indent=2))
    print(table(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
