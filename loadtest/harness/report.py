"""Outputs of a run: a JSON result, a Markdown summary, and small PNG plots."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.harness.runner import Run
from loadtest.harness.spec import Spec
from loadtest.harness.stats import ClassSummary, cdf, percentile, summarize


def summaries(spec: Spec, run: Run) -> list[ClassSummary]:
    out = []
    for cls in spec.classes:
        results = [r for r in run.results if r.cls == cls.name]
        out.append(summarize(cls.name, results, run.elapsed, cls.slo))
    return out


def to_json(spec: Spec, run: Run, classes: Sequence[ClassSummary], extra: dict[str, Any] | None = None) -> dict:
    return {
        "spec": spec.name, "target": run.target, "started_at": run.started_at, "elapsed_s": round(run.elapsed, 3),
        "interrupted": run.interrupted, "dropped": run.dropped, "offered_rate": run.offered_rate,
        "requests": len(run.results), "classes": [c.as_dict() for c in classes], **(extra or {}),
    }


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(spec: Spec, run: Run, classes: Sequence[ClassSummary]) -> str:
    lines = [f"### {spec.name} → {run.target}", "",
             f"{len(run.results)} requests in {run.elapsed:.1f} s"
             + (" (interrupted: partial results)" if run.interrupted else "")
             + (f"; {run.dropped} arrivals dropped by the client (max_inflight)" if run.dropped else ""), "",
             "| class | req/s | out tok/s | errors | goodput | TTFT p50/p95/p99 ms | TPOT p50/p95/p99 ms "
             "| total p50/p95/p99 ms |",
             "|---|---|---|---|---|---|---|---|"]
    for c in classes:
        def trio(q: dict[str, float | None]) -> str:
            return " / ".join(_fmt(q.get(k)) for k in ("p50", "p95", "p99"))
        lines.append(f"| {c.name} | {c.requests_per_s:.1f} | {c.output_tokens_per_s:.0f} | "
                     f"{c.error_rate:.2%} {c.errors or ''} | {_fmt(None if c.goodput is None else c.goodput * 100)}% "
                     f"| {trio(c.ttft_ms)} | {trio(c.tpot_ms)} | {trio(c.total_ms)} |")
    stages = sorted({s for c in classes for s in c.server_ms})
    if stages:
        lines += ["", "Gateway stages (Server-Timing, p50 / p99 ms):", "",
                  "| class | " + " | ".join(stages) + " |", "|---|" + "---|" * len(stages)]
        for c in classes:
            cells = [f"{_fmt(c.server_ms.get(s, {}).get('p50'), 3)} / {_fmt(c.server_ms.get(s, {}).get('p99'), 3)}"
                     for s in stages]
            lines.append(f"| {c.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# 1,200 x 660 pixels: the axis labels and legends read at a glance (at 6 x 3.6 in and 80 dpi, 480 x 288, they
# did not, and the offered-load line ran over the legend)
FIGSIZE, DPI = (10, 5.5), 120
STAGE_FLOOR_MS = 0.01  # a stage's bar drawn at least this tall on the log scale (its label says the value)


def plots(spec: Spec, run: Run, classes: Sequence[ClassSummary], out_dir: Path, prefix: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    paths = []
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    for cls in spec.classes:
        values = [r.ttft * 1000 for r in run.results if r.cls == cls.name and r.ok and r.ttft is not None]
        if values:
            xs, ys = cdf(values)
            ax.plot(xs, ys, label=cls.name)
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("share of requests")
    ax.set_title(f"{spec.name}: TTFT CDF")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    paths.append(_save(fig, out_dir / f"{prefix}-ttft-cdf.png"))

    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    for cls in spec.classes:
        rows = sorted((r.start, r.total * 1000) for r in run.results if r.cls == cls.name and r.ok and r.total)
        if rows:
            ax.scatter([x for x, _ in rows], [y for _, y in rows], s=4, alpha=0.5, label=f"{cls.name} total")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("latency (ms)")
    twin = ax.twinx()
    if run.results:
        width = max(run.elapsed / 40, 0.25)
        bins = [0] * (int(run.elapsed / width) + 1)
        for r in run.results:
            bins[min(int(r.start / width), len(bins) - 1)] += 1
        twin.step([i * width for i in range(len(bins))], [b / width for b in bins], color="gray", where="post",
                  label="offered req/s")
        twin.set_ylabel("offered req/s")
    ax.set_title(f"{spec.name}: latency over time vs offered load")
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    # one legend for both axes, outside the plot: nothing drawn runs over it
    ax.legend(handles + more, labels + more_labels, loc="upper left", bbox_to_anchor=(1.08, 1.0), fontsize=9,
              markerscale=3)
    paths.append(_save(fig, out_dir / f"{prefix}-latency-time.png"))

    stages = sorted({s for c in classes for s in c.server_ms})
    if stages:
        fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
        width = 0.8 / max(len(classes), 1)
        for i, c in enumerate(classes):
            values = [c.server_ms.get(s, {}).get("p50") or 0 for s in stages]
            bars = ax.bar([j + i * width for j in range(len(stages))], [max(v, STAGE_FLOOR_MS) for v in values],
                          width, label=c.name)
            ax.bar_label(bars, [f"{v:,.0f}" if v >= 10 else f"{v:.2g}" for v in values], fontsize=8, padding=2)
        ax.set_xticks([j + width * (len(classes) - 1) / 2 for j in range(len(stages))], stages, fontsize=10)
        # a log scale: a 0.2 ms cache lookup and a 2 s total on one axis, each bar labelled with its value
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
        ax.set_ylabel("p50 (ms, log scale)")
        ax.set_title(f"{spec.name}: gateway stage breakdown")
        ax.legend(fontsize=9)
        paths.append(_save(fig, out_dir / f"{prefix}-stages.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")  # the legend drawn outside the axes is kept
    plt.close(fig)
    return path


def write(spec: Spec, run: Run, out_dir: Path, prefix: str | None = None,
          extra: dict[str, Any] | None = None) -> tuple[dict, str, list[Path]]:
    prefix = prefix or spec.name
    classes = summaries(spec, run)
    data = to_json(spec, run, classes, extra)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{prefix}.json").write_text(json.dumps(data, indent=2))
    md = markdown(spec, run, classes)
    (out_dir / f"{prefix}.md").write_text(md)
    return data, md, plots(spec, run, classes, out_dir, prefix)


def per_class(result: Run) -> dict[str, Any]:
    """Per class of an overload run: sent, answered, shed (429), failed otherwise, TTFT p50/p95 of the answered,
    and the longest queue wait the gateway reported (Server-Timing); the scheduling and replicas benchmarks'
    table."""
    out: dict[str, Any] = {}
    for cls in sorted({r.cls for r in result.results}):
        rows = [r for r in result.results if r.cls == cls]
        ok = [r for r in rows if r.ok and r.ttft is not None]
        ttft = [r.ttft for r in ok]
        waits = [r.server.get("queue_wait", 0.0) for r in rows if r.server]
        out[cls] = {"sent": len(rows), "answered": len(ok), "shed_429": sum(r.status == 429 for r in rows),
                    "server_errors": sum(r.status >= 500 for r in rows),
                    "other_errors": sum(not r.ok and r.status != 429 and r.status < 500 for r in rows),
                    "ttft_p50_ms": round(percentile(ttft, 50) * 1000, 1) if ttft else None,
                    "ttft_p95_ms": round(percentile(ttft, 95) * 1000, 1) if ttft else None,
                    "max_queue_wait_ms": round(max(waits), 1) if waits else None}
    return out
