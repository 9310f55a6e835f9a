"""`tollgate diagnose`'s judgements from metric pages written here (the staged faults against real processes are
tests/process/test_diagnose.py): keep-alive from connections per request, the slowest stage from the stage histograms,
event-loop lag from this run's bucket deltas only, the report led by its first problem; and a probe timing each
content event of a stream from a scripted worker."""

from __future__ import annotations

import asyncio

import httpx

from gateway.ops import diagnose
from tests.fakes import FakeWorker, stream_of


def page(requests: float, opened: float, lag_buckets: dict[str, float] | None = None, queue: float = 0.0,
         connect: float = 0.0, ttft: float = 0.0, count: float = 0.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A gateway's /metrics as diagnose reads it (parsed by its own parser)."""
    lines = [f"tollgate_requests_total {requests}", f"tollgate_upstream_connections_opened_total {opened}"]
    for name, spent in (("tollgate_queue_wait_seconds", queue), ("tollgate_upstream_connect_seconds", connect),
                        ("tollgate_ttft_seconds", ttft)):
        lines += [f"# TYPE {name} histogram", f'{name}_bucket{{le="+Inf"}} {count}', f"{name}_count {count}",
                  f"{name}_sum {spent}"]
    buckets = lag_buckets or {"+Inf": 0.0}
    lines.append("# TYPE tollgate_event_loop_lag_seconds histogram")
    lines += [f'tollgate_event_loop_lag_seconds_bucket{{le="{le}"}} {v}' for le, v in buckets.items()]
    lines.append(f"tollgate_event_loop_lag_seconds_count {buckets['+Inf']}")
    return diagnose.metrics("\n".join(lines) + "\n")


def test_keep_alive_is_judged_on_connections_opened_per_request() -> None:
    reused = diagnose._keep_alive(page(10, 1), page(20, 2))
    assert not reused.problem and "90% reuse" in reused.detail
    fresh = diagnose._keep_alive(page(10, 1), page(20, 11))
    assert fresh.problem and "10 connections opened to workers for 10 requests" in fresh.detail
    assert not diagnose._keep_alive(page(0, 0), page(2, 2)).problem, "two requests are too few to judge"


def test_the_slowest_stage_is_what_ttft_spends_beyond_queue_and_connect() -> None:
    before = page(0, 0)
    after = page(10, 1, queue=0.1, connect=0.05, ttft=2.0, count=10)  # means: 10 ms, 5 ms, 200 ms
    slowest = next(f for f in diagnose._gateway_findings(before, after) if f.check == "slowest stage")
    assert "most is worker (engine queue + prefill)" in slowest.detail and "185 ms" in slowest.detail


def test_loop_lag_counts_this_runs_samples_only() -> None:
    """A slow start long ago sits in the buckets' totals; only what this run added is judged."""
    slow_start = {"0.005": 0.0, "0.05": 0.0, "1.0": 100.0, "+Inf": 100.0}
    now_quick = {"0.005": 50.0, "0.05": 50.0, "1.0": 150.0, "+Inf": 150.0}
    lag = next(f for f in diagnose._gateway_findings(page(0, 0, slow_start), page(0, 0, now_quick))
               if f.check == "gateway event-loop lag")
    assert not lag.problem and "p99 5 ms" in lag.detail
    now_slow = {"0.005": 0.0, "0.05": 0.0, "1.0": 150.0, "+Inf": 150.0}
    lag = next(f for f in diagnose._gateway_findings(page(0, 0, slow_start), page(0, 0, now_slow))
               if f.check == "gateway event-loop lag")
    assert lag.problem and "p99 1000 ms" in lag.detail


def test_the_report_leads_with_its_first_problem_and_gives_fixes_only_for_problems() -> None:
    reading = diagnose.Reading
    report = diagnose.Report([diagnose.Finding("buffering", reading.PROBLEM, "held back", "proxy_buffering off"),
                              diagnose.Finding("upstream keep-alive", reading.OK, "fine", "never shown")])
    lines = report.text().splitlines()
    assert lines[0] == "Where the time goes: buffering. proxy_buffering off"
    assert "[PROBLEM] buffering: held back" in lines and "        fix: proxy_buffering off" in lines
    assert "never shown" not in report.text() and [f.check for f in report.problems] == ["buffering"]
    assert diagnose.Report([]).text().startswith("Where the time goes: nothing stands out")


def test_a_probe_times_each_content_event_of_a_stream() -> None:
    async def main() -> diagnose.Probe:
        async with FakeWorker(stream_of(["a", "b", "", "c"], gap_s=0.01)) as worker, \
                httpx.AsyncClient(timeout=10) as client:
            return await diagnose.stream(client, worker.url, None, "sim-llama-8b", diagnose.SHORT, 4)
    probe = asyncio.run(main())
    assert probe.status == 200 and len(probe.arrivals) == 3, "an empty delta is not a token"
    assert probe.ttft == probe.arrivals[0] and probe.arrivals == sorted(probe.arrivals)
    assert probe.arrivals[-1] - probe.arrivals[0] >= 0.02 and probe.total >= probe.arrivals[-1]


def test_answers_with_no_text_give_readings_that_say_not_measured_never_nan() -> None:
    """A tiny random-weights model can answer in deltas that decode to nothing: every check still reads as a
    sentence (positive control: the same worker with text gives figures)."""
    async def run(words: list[str]) -> diagnose.Report:
        async with FakeWorker(stream_of(words, gap_s=0.001)) as worker:
            return await diagnose.run(worker.url, None, "sim-llama-8b", direct=worker.url, samples=2, tokens=4)
    silent = asyncio.run(run(["", ""]))
    text = silent.text()
    assert "nan" not in text.lower().split() and "nan%" not in text and "nan ms" not in text, text
    found = {f.check: f.detail for f in silent.findings}
    readings = {f.check: f.reading for f in silent.findings}
    assert readings["proxy overhead"] is readings["buffering"] is diagnose.Reading.NOT_MEASURED
    assert "[not measured] buffering: each answer carried at most" in text
    assert "every check passed" not in text and "not measured: proxy overhead, buffering" in text.splitlines()[0]
    assert "ttft_p50_ms" not in silent.figures
    spoken = asyncio.run(run(["a", "b", "c"]))
    found = {f.check: f.detail for f in spoken.findings}
    assert "ms direct" in found["proxy overhead"] and "spread over" in found["buffering"], spoken.text()
    assert "flagged past 1.5x and +50 ms" in found["proxy overhead"]
    assert spoken.figures["ttft_p50_ms"] > 0


def test_a_time_is_flagged_past_its_stated_factor_and_floor() -> None:
    """Crowding: 15 ms alone against 85 ms beside is a problem (5.7x, +70 ms); 11 against 36 ms is not (3.3x
    but +25 ms, a busy host's noise); 100 against 190 ms is not (1.9x)."""
    bound = diagnose.CROWDING_BOUND
    assert diagnose.differs(0.085, 0.015, *bound) and not diagnose.differs(0.036, 0.011, *bound)
    assert not diagnose.differs(0.190, 0.100, *bound) and diagnose.differs(0.210, 0.100, *bound)
