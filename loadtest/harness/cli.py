"""`tollgate loadtest run | compare | ramp`."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from loadtest.harness import report
from loadtest.harness.runner import Run, run
from loadtest.harness.spec import Spec, SpecError, load_spec
from loadtest.harness.stats import percentile

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def scenarios() -> dict[str, str]:
    """The packaged scenarios: name -> the first sentence of the comment that opens the file."""
    out = {}
    for path in sorted(SCENARIOS.glob("*.yaml")):
        lines = path.read_text().splitlines()
        opening = " ".join(line.lstrip("# ").strip() for line in itertools.takewhile(lambda x: x.startswith("#"),
                                                                                      lines))
        out[path.stem] = opening.split(". ")[0].rstrip(".") + "."
    return out


def spec_help() -> str:
    """What --help says a spec is: the packaged scenarios by name, and the fields a spec holds (read from the
    spec's own models, so the list cannot drift from what is accepted)."""
    from loadtest.harness.spec import Closed, Open, RequestClass

    def item(head: str, text: str) -> str:
        return textwrap.fill(text, 100, initial_indent=f"  {head:<16} ", subsequent_indent=" " * 19)

    named = "\n".join(item(name, line) for name, line in scenarios().items())
    fields = "\n".join([
        item("(top level)", ", ".join(Spec.model_fields)),
        item("arrival", f"closed ({', '.join(f for f in Closed.model_fields if f != 'mode')}) or open "
                        f"({', '.join(f for f in Open.model_fields if f != 'mode')})"),
        item("classes: each", ", ".join(RequestClass.model_fields)),
        item("a length", "(prompt_tokens, max_tokens) {dist: fixed, value: N} | {dist: uniform, min, max} | "
                         "{dist: normal|lognormal, mean, sd}")])
    return (f"SPEC is a YAML file, or the name of a packaged scenario (in {SCENARIOS}):\n{named}\n\n"
            f"A spec holds:\n{fields}\n\nStart from a scenario: copy {SCENARIOS / 'smoke.yaml'} and edit it.")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    described = {"epilog": spec_help(), "formatter_class": argparse.RawDescriptionHelpFormatter}
    parser = sub.add_parser("loadtest", help="load generator: TTFT / TPOT / queue wait per class", **described)
    modes = parser.add_subparsers(dest="loadtest_command", required=True)

    one = modes.add_parser("run", help="run a workload spec against one target", **described)
    one.add_argument("spec")
    one.add_argument("--target", help="overrides the spec's target URL")
    one.add_argument("--out", default="loadtest/results/scenarios", help="where JSON, Markdown and PNGs go")
    one.set_defaults(func=cmd_run)

    compare = modes.add_parser("compare", help="one workload against several targets, interleaved; prints ratios",
                               **described)
    compare.add_argument("spec")
    compare.add_argument("--target", action="append", metavar="NAME=URL",
                         help="repeat: the first is the baseline (default: the spec's targets)")
    compare.add_argument("--rounds", type=int, default=3, help="interleaved rounds per target")
    compare.add_argument("--out", default="loadtest/results/scenarios")
    compare.set_defaults(func=cmd_compare)

    ramp = modes.add_parser("ramp", help="raise the offered load past capacity; report the knee", **described)
    ramp.add_argument("spec")
    ramp.add_argument("--target")
    ramp.add_argument("--out", default="loadtest/results/scenarios")
    ramp.set_defaults(func=cmd_ramp)


def _load(path: str) -> Spec:
    """The spec at ``path``, or the packaged scenario of that name."""
    if not Path(path).exists() and (SCENARIOS / f"{path}.yaml").exists():
        path = str(SCENARIOS / f"{path}.yaml")
    try:
        return load_spec(path)
    except SpecError as exc:
        sys.exit(f"tollgate loadtest: {path} is not a valid spec:\n{exc}")
    except OSError as exc:
        sys.exit(f"tollgate loadtest: cannot read {path}: {exc.strerror}")


PLAIN_EVERY_S = 5.0  # without a terminal (CI, a pipe): a progress line this often


def _execute(spec: Spec, target: str | None, **kw: Any) -> Run:
    """Run with a progress bar on a terminal, or a line every few seconds on stderr without one (a pipe or a
    CI log showed nothing until the end); Ctrl-C ends the run early and keeps its results."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    total = kw.get("duration") or spec.duration_s
    terminal = sys.stderr.isatty()
    said = [1.0 - PLAIN_EVERY_S]  # the first line after a second, then every PLAIN_EVERY_S
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[done]} done"),
                  TimeElapsedColumn(), transient=True, disable=not terminal) as bar:
        task = bar.add_task(spec.name, total=total or spec.requests, done=0)

        def progress(done: int, elapsed: float) -> None:
            bar.update(task, completed=elapsed if total else done, done=done)
            if not terminal and elapsed - said[0] >= PLAIN_EVERY_S:
                said[0] = elapsed
                goal = f"of {total:.0f} s" if total else f"of {spec.requests} requests"
                print(f"{spec.name}: {elapsed:.0f} s {goal}, {done} done ({done / max(elapsed, 1e-9):.1f}/s)",
                      file=sys.stderr, flush=True)
        loop = asyncio.new_event_loop()
        main = loop.create_task(run(spec, target, progress, **kw))
        try:
            return loop.run_until_complete(main)
        except KeyboardInterrupt:
            main.cancel()
            return loop.run_until_complete(main)
        finally:
            loop.close()


def cmd_run(args: argparse.Namespace) -> None:
    spec = _load(args.spec)
    result = _execute(spec, args.target)
    _, md, pngs = report.write(spec, result, Path(args.out))
    print(md)
    print("wrote", ", ".join(str(p) for p in [Path(args.out) / f"{spec.name}.json", *pngs]))


def cmd_compare(args: argparse.Namespace) -> None:
    spec = _load(args.spec)
    targets = list((spec.targets or {}).items()) if not args.target else []
    for item in args.target or []:
        name, sep, url = item.partition("=")
        if not sep or not url:
            sys.exit(f"tollgate loadtest: --target takes NAME=URL, got {item!r}")
        targets.append((name, url))
    if len(targets) < 2:
        sys.exit("tollgate loadtest: compare needs two or more targets (--target NAME=URL or `targets:`)")
    per_round = (spec.duration_s or 10) / args.rounds
    merged: dict[str, Run] = {}
    for i in range(args.rounds):
        order = targets if i % 2 == 0 else list(reversed(targets))  # interleave to cancel drift
        for name, url in order:
            part = _execute(spec, url, duration=per_round)
            if name not in merged:
                merged[name] = part
            else:
                merged[name].extend(part)
            if part.interrupted:
                break
    rows = {}
    for name, result in merged.items():
        data, md, _ = report.write(spec, result, Path(args.out), prefix=f"{spec.name}-{name}")
        print(md)
        rows[name] = {c["name"]: c for c in data["classes"]}
    baseline = targets[0][0]
    print(f"Ratios against {baseline} (p50 / p99):")
    for name, _ in targets[1:]:
        for cls, c in rows[name].items():
            b = rows[baseline][cls]
            for metric in ("ttft_ms", "total_ms"):
                ratio = [_ratio(c[metric][q], b[metric][q]) for q in ("p50", "p99")]
                added = [_delta(c[metric][q], b[metric][q]) for q in ("p50", "p99")]
                print(f"  {name} {cls} {metric}: x{ratio[0]} / x{ratio[1]}  (added {added[0]} / {added[1]} ms)")


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.3f}"


def _delta(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a - b:+.3f}"


def find_knee(steps: list[dict[str, float]]) -> int | None:
    """Index of the first step past capacity: completions fall behind the offered rate, errors pass 1%, or
    p95 TTFT or p95 total triples over the first step's (queues grow without bound past the knee)."""
    if not steps:
        return None
    base_total = steps[0]["p95_total_ms"] or 0.0
    base_ttft = steps[0].get("p95_ttft_ms") or 0.0
    for i, s in enumerate(steps):
        if (s["achieved_rps"] < 0.9 * s["offered_rps"] or s["error_rate"] > 0.01
                or (base_total and s["p95_total_ms"] > 3 * base_total)
                or (base_ttft and s.get("p95_ttft_ms", 0.0) > 3 * base_ttft)):
            return i
    return None


def cmd_ramp(args: argparse.Namespace) -> None:
    spec = _load(args.spec)
    if spec.ramp is None:
        sys.exit("tollgate loadtest: ramp needs a `ramp:` section (rates, step_s) in the spec")
    steps = []
    runs = []
    for rate in spec.ramp.rates:
        result = _execute(spec, args.target, rate=rate, duration=spec.ramp.step_s)
        runs.append(result)
        ok = [r for r in result.results if r.ok]
        steps.append({
            # what the step's arrivals got served, per second of the step (the drain after it is not load)
            "offered_rps": rate, "achieved_rps": len(ok) / spec.ramp.step_s,
            "error_rate": 1 - len(ok) / len(result.results) if result.results else 0.0,
            "p95_ttft_ms": (percentile([r.ttft for r in ok if r.ttft is not None], 95) or 0) * 1000,
            "p95_total_ms": (percentile([r.total for r in ok if r.total is not None], 95) or 0) * 1000,
        })
        print(json.dumps(steps[-1]))
        if result.interrupted:
            break
    knee = find_knee(steps)
    merged = runs[0]
    for part in runs[1:]:
        merged.extend(part)
    extra = {"steps": steps, "knee_index": knee,
             "knee_offered_rps": None if knee is None else steps[knee]["offered_rps"],
             "capacity_rps": None if not knee else steps[knee - 1]["achieved_rps"]}
    _, md, _ = report.write(spec, merged, Path(args.out), extra=extra)
    print(md)
    if knee is None:
        print("No knee within the offered rates: raise them.")
    else:
        print(f"Knee at {steps[knee]['offered_rps']:.1f} req/s offered"
              + (f"; capacity about {extra['capacity_rps']:.1f} req/s" if knee else " (the first step)"))
