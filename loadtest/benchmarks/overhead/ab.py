"""Gateway CPU per request of two checkouts, alternated (python -m loadtest run ab OLD_CHECKOUT NEW_CHECKOUT).

Run-to-run spread on this shared machine is about ±25%, larger than most changes to the request path, so a
before/after claim needs both gateways measured side by side: each start runs a zero-delay simulated worker
(``--workers N``: N of them, for routing between workers) and the gateway of one checkout (gateway on CPU 1,
workers and client on CPU 0), then three closed-loop runs at c=1 of 64-token streams and of plain 16-token
chats; starts alternate between the checkouts. Prints every run and the medians. A checkout is a directory with
this repository's layout (e.g. `git worktree add`).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

# Runs in the checkout measured (its own loadtest and gateway): this layout's harness, or, in a checkout from before
# loadtest/harness/ (e.g. bdae962), its loadtest.bench_overhead, which held the same policy and workload then. Chosen
# by what the checkout holds: an editable install's finder would hand an old checkout this tree's harness (whose
# processes start this tree's gateway).
_IMPORTS = """
import asyncio, json, os, sys, tempfile
from pathlib import Path
sys.path.insert(0, os.getcwd())
import loadtest
if (Path(loadtest.__file__).parent / "harness").is_dir():
    from loadtest.harness.policy import build_policy
    from loadtest.harness.procs import start_gateway, start_sim
    from loadtest.harness.runner import run
    from loadtest.harness.spec import closed_spec as spec
    LAYOUT = "loadtest.harness"

    def policy(worker):
        return build_policy([worker], "bench")
else:
    from loadtest.bench_overhead import policy, spec
    from loadtest.procs import start_gateway, start_sim
    from loadtest.runner import run
    LAYOUT = "loadtest.bench_overhead"
STARTS = sys.modules[start_gateway.__module__].__file__
assert Path(STARTS).is_relative_to(os.getcwd()), f"{STARTS} is not the checkout's"
"""
_ONE_START = _IMPORTS + """
os.sched_setaffinity(0, {0})
tmp = Path(tempfile.mkdtemp())
sims = [start_sim(tmp, "--zero-delay", cpu=0) for _ in range(int(os.environ.get("BENCH_AB_WORKERS", "1")))]
pol = policy(sims[0].url)
pol["pools"]["p"]["workers"] = [s.url for s in sims]
if os.environ.get("BENCH_AB_ROUTING"):
    pol["pools"]["p"]["routing"] = os.environ["BENCH_AB_ROUTING"]
gw = start_gateway(tmp, pol, cpu=1)
out = {"stream": [], "plain": []}
try:
    for kind, stream, tokens in (("stream", True, 64), ("plain", False, 16)):
        asyncio.run(run(spec(1, stream, tokens, 1.0), gw.url))
        for _ in range(3):
            before = gw.cpu_seconds()
            result = asyncio.run(run(spec(1, stream, tokens, %(seconds)s), gw.url))
            out[kind].append((gw.cpu_seconds() - before) / len(result.results) * 1000)
finally:
    gw.kill()
    for sim in sims:
        sim.kill()
print(json.dumps(out))
"""


def layout(checkout: Path) -> str:
    """Which harness the checkout's start would use (its imports only: no process started)."""
    done = subprocess.run([sys.executable, "-c", _IMPORTS + "print(LAYOUT, 'from', STARTS)"], cwd=checkout,
                          capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise SystemExit(f"{checkout}: the start's imports fail:\n{done.stderr.strip()}")
    return done.stdout.strip().splitlines()[-1]


def one_start(checkout: Path, seconds: float, env: dict[str, str] | None = None) -> dict[str, list[float]]:
    import json
    import os

    done = subprocess.run([sys.executable, "-c", _ONE_START % {"seconds": seconds}], cwd=checkout,
                          capture_output=True, text=True, check=True, timeout=300, env={**os.environ, **(env or {})})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--starts", type=int, default=3, help="starts per checkout")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--new-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the new checkout's gateways only (e.g. OTEL_* to measure "
                             "tracing on against off in one checkout)")
    parser.add_argument("--old-env", action="append", default=[], metavar="NAME=VALUE",
                        help="the same for the old checkout's gateways")
    parser.add_argument("--workers", type=int, default=1, help="simulated workers in the pool (routing between "
                        "them, e.g. prefix affinity, runs only with more than one; BENCH_AB_ROUTING=load|prefix|"
                        "round_robin in --old-env/--new-env sets each arm's)")
    parser.add_argument("--dry-run", action="store_true", help="only check each checkout's imports (which "
                        "harness its starts would use) and exit: no process started")
    args = parser.parse_args()
    if args.dry_run:
        for name, checkout in (("old", args.old), ("new", args.new)):
            print(name, checkout.resolve(), layout(checkout.resolve()))
        return
    shared = {"BENCH_AB_WORKERS": str(args.workers)}
    new_env = {**shared, **dict(item.split("=", 1) for item in args.new_env)}
    old_env = {**shared, **dict(item.split("=", 1) for item in args.old_env)}
    runs: dict[str, dict[str, list[float]]] = {"old": {"stream": [], "plain": []}, "new": {"stream": [], "plain": []}}
    for _ in range(args.starts):
        for name, checkout in (("old", args.old), ("new", args.new)):
            result = one_start(checkout.resolve(), args.seconds, new_env if name == "new" else old_env)
            for kind, values in result.items():
                runs[name][kind] += values
            print(name, {k: [round(v, 3) for v in vs] for k, vs in result.items()}, flush=True)
    for name, kinds in runs.items():
        print(name, {kind: f"median {statistics.median(v):.3f} ms ({min(v):.3f}-{max(v):.3f})"
                     for kind, v in kinds.items()})
    # a change of tens of microseconds is below the medians' spread: the means' difference says it more finely
    print("new - old", {kind: f"{(statistics.mean(runs['new'][kind]) - statistics.mean(v)) * 1000:+.1f} us (means)"
                        for kind, v in runs["old"].items()})


if __name__ == "__main__":
    main()
