"""The scaling signal: the sources' rules replayed over a traffic trace, and TTFT p95 from the histogram."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

from gateway.ops.metrics import GatewayMetrics
from gateway.ops.scaling import Autoscaler, ScaleRules, Signals
from gateway.policy.schema import Autoscaling, Policy

SLO_S = 0.8
STEP_S = 5.0


def trace() -> list[tuple[float, float, float, float | None]]:
    """(time, KV usage, queued, TTFT p95) every 5 s for 70 minutes: quiet, a morning ramp that fills the KV cache,
    a TTFT excursion with a short KV lull, a long plateau, then night (with one short blip of queue)."""
    rows: list[tuple[float, float, float, float | None]] = []
    t = 0.0
    while t < 70 * 60:
        minute = t / 60
        if minute < 5:
            kv, queued, ttft = 0.25, 0.0, 0.2
        elif minute < 15:
            kv, queued, ttft = 0.85, 12.0, 0.5  # KV over 80%: out
        elif minute < 17:
            kv, queued, ttft = 0.6, 0.0, 0.7  # TTFT p95 700 ms > 80% of 800: out (if not cooling)
        elif minute < 30:
            kv, queued, ttft = 0.6, 20.0, 0.3  # busy but within every bar
        elif minute < 45:
            kv, queued, ttft = 0.1, 0.0, 0.15  # quiet
        elif minute < 45.2:
            kv, queued, ttft = 0.1, 3.0, 0.15  # a blip of queue restarts the quiet clock
        else:
            kv, queued, ttft = 0.1, 0.0, 0.15
        rows.append((t, kv, queued, ttft))
        t += STEP_S
    return rows


def replay(spec: Autoscaling, workers: int = 2) -> list[tuple[float, int, str]]:
    rules = ScaleRules(spec)
    changes = []
    desired = workers
    for t, kv, queued, ttft in trace():
        decision = rules.decide(t, Signals(desired, kv, queued, ttft, SLO_S))
        if decision.desired != desired:
            changes.append((t, decision.desired, decision.reason))
            desired = decision.desired
    return changes


def test_out_when_the_rules_say_in_only_after_ten_quiet_minutes_never_within_the_cooldown() -> None:
    changes = replay(Autoscaling(min_workers=1, max_workers=8))
    times = [t for t, _, _ in changes]
    assert changes[0][:2] == (5 * 60, 3) and "KV cache 85% > 80%" in changes[0][2], "out at once on KV"
    assert changes[1][0] == 10 * 60 and changes[1][1] == 4, "still over: out again right after the cooldown"
    assert changes[2][0] == 15 * 60 and changes[2][1] == 5 and "TTFT p95 700 ms" in changes[2][2], \
        "TTFT over 80% of the SLO is a reason of its own"
    assert all(b - a >= 300 for a, b in itertools.pairwise(times)), "never twice within 5 minutes"
    ins = [(t, d) for t, d, reason in changes if reason.startswith("scale in")]
    busy = [t for t, kv, queued, _ in trace() if queued > 0 or kv >= 0.3]
    last_busy_before_quiet = max(t for t in busy if t < 30 * 60)
    blip_end = max(busy)
    # quiet from minute 30: in 10 minutes after the last busy sample; the blip at 45 restarts the clock
    assert ins[0] == (last_busy_before_quiet + 600, 4)
    assert ins[1] == (blip_end + 600, 3)
    assert all(reason.startswith(("scale out", "scale in")) for _, _, reason in changes)
    assert not [t for t, d, reason in changes if reason.startswith("scale in") and 5 * 60 <= t < 39 * 60], \
        "never in while busy"


def test_bounds_hold() -> None:
    changes = replay(Autoscaling(min_workers=2, max_workers=3))
    assert max(d for _, d, _ in changes) == 3 and min(d for _, d, _ in changes) >= 2


def one_pool() -> tuple[Policy, GatewayMetrics, Autoscaler]:
    """Model m on pool p, and an autoscaler over a minute's window that has taken its first step."""
    policy = Policy.model_validate({"version": 1, "allow_empty": True,
                                    "models": {"m": {"pool": "p"}},
                                    "pools": {"p": {"workers": ["http://127.0.0.1:9"]}}})
    metrics = GatewayMetrics()
    scaler = Autoscaler(metrics, window_s=60)
    scaler.step(0.0, policy, {}, {})
    return policy, metrics, scaler


def test_ttft_p95_comes_from_the_histograms_last_minute() -> None:
    policy, metrics, scaler = one_pool()
    for i in range(100):  # 95 fast answers, 5 slow ones
        metrics.ttft.labels("premium", "m").observe(0.05 if i < 95 else 3.0)
    scaler.step(10.0, policy, {}, {})
    p95 = scaler._ttft_p95("p", scaler._buckets(policy), "premium")
    assert p95 is not None and p95 <= 0.1
    assert scaler._ttft_p95("p", scaler._buckets(policy), "batch") is None, "no batch answers in the window"
    for _ in range(100):  # a minute later only slow answers come
        metrics.ttft.labels("premium", "m").observe(2.0)
    for t in (40.0, 70.0, 80.0):
        scaler.step(t, policy, {}, {})
    p95 = scaler._ttft_p95("p", scaler._buckets(policy), "premium")
    assert p95 is not None and p95 > 1.0, "the old fast answers left the window"


def test_each_class_is_held_to_its_own_ttft_objective() -> None:
    policy, metrics, scaler = one_pool()
    batch_slo = policy.tiers["batch"].slo.ttft_p95_ms / 1000
    for _ in range(50):  # batch waits long, well within its own objective; premium is fast
        metrics.ttft.labels("batch", "m").observe(min(20.0, batch_slo / 4))
        metrics.ttft.labels("premium", "m").observe(0.05)
    buckets = scaler._buckets(policy)
    tier, p95, slo = scaler._worst_tier("p", buckets, policy)
    assert p95 is not None and p95 < 0.8 * slo, f"{tier}: slow batch answers are no reason to scale out"
    for _ in range(50):  # now premium answers take 2 s against its 800 ms
        metrics.ttft.labels("premium", "m").observe(2.0)
    tier, p95, slo = scaler._worst_tier("p", scaler._buckets(policy), policy)
    assert tier == "premium" and p95 is not None and p95 > 0.8 * slo


def recorded() -> list[dict[str, str]]:
    """A trace recorded by `python -m loadtest run record_trace`: the gateway's own scale-signal inputs every 5 s
    while two simulated workers took light load, a 6.5-minute overload, busy load, light load, a 20-second
    blip and 22 idle minutes (loadtest/RESULTS.md, "Scale signal on a recorded trace")."""
    with open(Path(__file__).resolve().parents[2] / "data" / "scale_trace.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_the_rules_on_a_recorded_trace() -> None:
    spec = Autoscaling(min_workers=1, max_workers=8)
    rows = recorded()
    assert {"overload", "blip", "idle"} <= {r["phase"] for r in rows} and len(rows) > 400

    def over(r: dict[str, str]) -> bool:
        ttft = float(r["ttft_p95_ms"]) if r["ttft_p95_ms"] else None
        return (float(r["kv_usage"]) > spec.kv_out or float(r["queued"]) > spec.queue_out
                or (ttft is not None and ttft > spec.ttft_slo_share * float(r["ttft_slo_ms"])))

    def busy(r: dict[str, str]) -> bool:
        return float(r["queued"]) > 0 or float(r["kv_usage"]) >= spec.kv_in

    rules = ScaleRules(spec)
    desired = int(rows[0]["workers"])
    changes: list[tuple[float, int, str]] = []
    for r in rows:
        t = float(r["t_s"])
        ttft = float(r["ttft_p95_ms"]) / 1000 if r["ttft_p95_ms"] else None
        decision = rules.decide(t, Signals(desired, float(r["kv_usage"]), float(r["queued"]), ttft,
                                           float(r["ttft_slo_ms"]) / 1000, r["ttft_tier"]))
        if decision.desired != desired:
            changes.append((t, decision.desired, decision.reason))
        desired = decision.desired
    times = [t for t, _, _ in changes]
    outs = [(t, d) for t, d, reason in changes if reason.startswith("scale out")]
    ins = [(t, d) for t, d, reason in changes if reason.startswith("scale in")]
    assert outs and ins, changes

    first_over = next(float(r["t_s"]) for r in rows if over(r))
    assert times[0] == first_over, "out at the first sample the sources' rules say so"
    assert all(b - a >= spec.cooldown_s for a, b in itertools.pairwise(times)), "never twice in the cooldown"
    # out whenever a rule holds and the cooldown allows it
    last = None
    for r in rows:
        t = float(r["t_s"])
        if over(r) and (last is None or t - last >= spec.cooldown_s):
            assert t in times, f"over a bar at {t:.0f} s, out of cooldown, and no scale-out"
        if t in times:
            last = t
    # in only after 10 quiet minutes: nothing queued and KV under 30% in every sample of the 10 minutes before
    for t, _ in ins:
        window = [r for r in rows if t - spec.quiet_in_s < float(r["t_s"]) <= t]
        assert window and not any(busy(r) for r in window), f"scale-in at {t:.0f} s without 10 quiet minutes"
        # and not later than the rules allow: the first sample once quiet long enough and out of cooldown
        quiet_since = max(float(r["t_s"]) for r in rows if float(r["t_s"]) < t and busy(r))
        earlier = [c for c in times if c < t]
        since_in = max((c for c, _ in ins if c < t), default=None)
        allowed = max(quiet_since if since_in is None else max(quiet_since, since_in), 0) + spec.quiet_in_s
        allowed = max(allowed, earlier[-1] + spec.cooldown_s) if earlier else allowed
        assert t == min(float(r["t_s"]) for r in rows if float(r["t_s"]) >= allowed), (t, allowed)
    blip = max(float(r["t_s"]) for r in rows if busy(r))
    assert ins[-1][0] >= blip + spec.quiet_in_s, "the blip restarted the quiet clock"

    # the gateway's own live decisions over the same run went through the same counts
    live = [int(r["live_desired"]) for r in rows]
    steps = [d for i, d in enumerate(live) if i == 0 or d != live[i - 1]]
    assert steps == [int(rows[0]["workers"]), *(d for _, d, _ in changes)], (steps, changes)
