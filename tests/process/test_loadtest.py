"""The load generator: statistics on known inputs, spec validation, and a real 5-second run."""

from __future__ import annotations

import json
import os
import random
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml

from loadtest.harness.cli import _load, find_knee
from loadtest.harness.client import Result, parse_server_timing
from loadtest.harness.spec import SLO, Distribution, RequestClass, Spec, SpecError, parse_spec
from loadtest.harness.stats import cdf, goodput, percentile, summarize
from loadtest.harness.workload import Workload
from tests.conftest import DEMO_KEY, ROOT, Proc, policy_dict

SCENARIOS = sorted((ROOT / "loadtest" / "scenarios").glob("*.yaml"))


def test_percentile_matches_numpy_linear() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
    assert percentile([], 50) is None
    assert percentile([3, 1, 2], 0) == 1 and percentile([3, 1, 2], 100) == 3
    rng = random.Random(0)
    for n in (2, 7, 100, 1001):
        values = [rng.expovariate(1.0) for _ in range(n)]
        for q in (50, 95, 99, 99.9):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_cdf_and_goodput() -> None:
    xs, ys = cdf([3.0, 1.0, 2.0, 2.0])
    assert xs == [1.0, 2.0, 2.0, 3.0] and ys == [0.25, 0.5, 0.75, 1.0]

    def result(status: int, ttft: float, total: float) -> Result:
        return Result("c", "fresh", True, 0.0, status=status, ttft=ttft, total=total)
    results = [result(200, 0.1, 1.0), result(200, 0.9, 1.0), result(200, 0.1, 9.0), result(500, 0.1, 1.0)]
    assert goodput(results, SLO(ttft_ms=800, total_ms=8000)) == 0.25
    assert goodput(results, SLO(ttft_ms=800)) == 0.5
    assert goodput(results, None) == 0.75
    assert goodput([], None) is None


def test_summary_on_known_results() -> None:
    results = [Result("c", "fresh", True, i, status=200, ttft=t, total=t * 10, output_tokens=10, gaps=[0.01] * 9)
               for i, t in enumerate((0.1, 0.2, 0.3, 0.4))]
    results.append(Result("c", "fresh", True, 5, status=429, error="rate_limited", total=0.01))
    summary = summarize("c", results, elapsed=2.0, slo=SLO(ttft_ms=250))
    assert summary.requests == 5 and summary.ok == 4
    assert summary.errors == {"rate_limited": 1} and summary.error_rate == 0.2
    assert summary.requests_per_s == 2.0 and summary.output_tokens_per_s == 20.0
    assert summary.ttft_ms["p50"] == 250.0 and summary.ttft_ms["mean"] == 250.0
    assert summary.goodput == 0.4
    assert summary.itl_ms["p99"] == 10.0


def test_server_timing_parsing() -> None:
    assert parse_server_timing("queue_wait;dur=0.002, upstream_connect;dur=1.2,ttft;dur=3.9") == {
        "queue_wait": 0.002, "upstream_connect": 1.2, "ttft": 3.9}
    assert parse_server_timing("") == {}
    assert parse_server_timing("cache;desc=hit, total;dur=x") == {}


def test_knee_detection() -> None:
    def step(offered: float, achieved: float, p95: float, errors: float = 0.0) -> dict[str, float]:
        return {"offered_rps": offered, "achieved_rps": achieved, "p95_total_ms": p95, "error_rate": errors,
                "p95_ttft_ms": 0.0}
    assert find_knee([step(10, 10, 100), step(20, 20, 120), step(40, 30, 150)]) == 2
    assert find_knee([step(10, 10, 100), step(20, 20, 350)]) == 1
    assert find_knee([step(10, 10, 100), step(20, 20, 100, errors=0.05)]) == 1
    assert find_knee([step(10, 10, 100), step(20, 19.5, 110)]) is None
    ttft_blowup = step(20, 20, 120)
    ttft_blowup["p95_ttft_ms"] = 31.0
    first = step(10, 10, 100)
    first["p95_ttft_ms"] = 10.0
    assert find_knee([first, ttft_blowup]) == 1


BASE = {"name": "t", "arrival": {"mode": "closed", "concurrency": 2}, "duration_s": 1,
        "classes": [{"name": "a", "model": "m"}]}


@pytest.mark.parametrize("change, path, words", [
    ({"duration_s": None}, "<root>", "duration_s or requests"),
    ({"arrival": {"mode": "closed"}}, "arrival.concurrency", "required"),
    ({"arrival": {"mode": "open", "rate": -1}}, "arrival.rate", "greater than 0"),
    ({"arrival": {"mode": "sideways"}}, "arrival", "mode"),
    ({"classes": [{"name": "a", "model": "m", "prompt_tokens": {"dist": "uniform", "min": 5}}]},
     "classes.0.prompt_tokens", "needs max"),
    ({"classes": [{"name": "a", "model": "m", "strem": True}]}, "classes.0.strem", "Extra inputs"),
    ({"classes": [{"name": "a", "model": "m", "repeat_exact": 0.7, "repeat_paraphrase": 0.5}]}, "classes.0",
     "must not exceed 1"),
])
def test_bad_specs_name_the_field(change: dict, path: str, words: str) -> None:
    spec = {**BASE, **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    with pytest.raises(SpecError) as info:
        parse_spec(yaml.safe_dump(spec))
    errors = dict(info.value.errors)
    assert path in errors, errors
    assert words in errors[path]


def test_cli_reports_a_bad_spec(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**BASE, "classes": [{"name": "a"}]}))
    result = subprocess.run([sys.executable, "-m", "gateway", "loadtest", "run", str(bad)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "classes.0.model" in result.stderr and "Traceback" not in result.stderr


def test_help_names_every_scenario_and_every_field_a_spec_accepts() -> None:
    """`tollgate loadtest run --help` says where the scenarios are, what each does and what a spec holds; a
    scenario's name runs it (a field added to the spec shows up without editing the help)."""
    result = subprocess.run([sys.executable, "-m", "gateway", "loadtest", "run", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "100"})
    assert result.returncode == 0, result.stderr
    words = " ".join(result.stdout.split())
    assert all(path.stem in words for path in SCENARIOS) and str(SCENARIOS[0].parent) in words
    assert all(field in words for field in (*Spec.model_fields, *RequestClass.model_fields)), words
    assert _load("smoke").name == "smoke"


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_checked_in_scenarios_are_valid(path: Path) -> None:
    spec = parse_spec(path.read_text())
    assert spec.name == path.stem


def test_distributions_and_repeats_are_seeded() -> None:
    rng = random.Random(1)
    lognormal = Distribution(dist="lognormal", mean=200, sd=150, min=8, max=2000)
    samples = [lognormal.sample(rng) for _ in range(5000)]
    assert min(samples) >= 8 and max(samples) <= 2000
    assert 170 < sum(samples) / len(samples) < 230
    spec = parse_spec(yaml.safe_dump({**BASE, "classes": [
        {"name": "a", "model": "m", "repeat_exact": 0.5, "prompt_tokens": {"dist": "fixed", "value": 12}}]}))
    first = [Workload(spec).next() for _ in range(1)]
    w1, w2 = Workload(spec), Workload(spec)
    bodies1 = [w1.next().body for _ in range(50)]
    assert bodies1 == [w2.next().body for _ in range(50)], "same seed, same requests"
    kinds = [Workload(spec).next().kind for _ in range(3)] + [w1.next().kind for _ in range(200)]
    assert 0.35 < kinds.count("exact") / len(kinds) < 0.65
    assert first[0].kind == "fresh"


def test_a_words_seed_changes_the_words_alone() -> None:
    """The same requests at the same sizes with other words: an engine's prefix cache does not know them."""
    classes = [{"name": "a", "model": "m", "prompt_tokens": {"dist": "lognormal", "mean": 64, "sd": 64},
                "max_tokens": {"dist": "uniform", "min": 1, "max": 50}}]
    one, other = (Workload(parse_spec(yaml.safe_dump({**BASE, "words_seed": words, "classes": classes})))
                  for words in (7, 8))
    for _ in range(20):
        a, b = orjson.loads(one.next().body), orjson.loads(other.next().body)
        assert a["max_tokens"] == b["max_tokens"]
        words_a, words_b = a["messages"][0]["content"].split(), b["messages"][0]["content"].split()
        assert len(words_a) == len(words_b) and words_a != words_b


def test_five_second_run_through_the_gateway(start_sim: Callable[..., Proc],
                                             start_gateway: Callable[..., Proc], tmp_path: Path) -> None:
    sim = start_sim("--decode-base-ms", "2")
    gw = start_gateway(policy_dict([sim.url]))
    spec = {"name": "e2e", "arrival": {"mode": "closed", "concurrency": 4}, "duration_s": 5, "seed": 9,
            "classes": [
                {"name": "stream", "api_key": DEMO_KEY, "model": "sim-llama-8b", "stream": True,
                 "max_tokens": {"dist": "fixed", "value": 16}, "slo": {"ttft_ms": 5000}},
                {"name": "plain", "api_key": DEMO_KEY, "model": "sim-llama-8b", "stream": False,
                 "max_tokens": {"dist": "fixed", "value": 8}},
                {"name": "unauthorized", "api_key": "tg-nope", "model": "sim-llama-8b", "weight": 0.2}]}
    path = tmp_path / "e2e.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = subprocess.run([sys.executable, "-m", "gateway", "loadtest", "run", str(path), "--target", gw.url,
                             "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "out" / "e2e.json").read_text())
    classes = {c["name"]: c for c in data["classes"]}
    assert 4.5 < data["elapsed_s"] < 15
    stream, plain, bad = classes["stream"], classes["plain"], classes["unauthorized"]
    assert stream["requests"] > 10 and stream["error_rate"] == 0
    assert stream["ttft_ms"]["p50"] is not None and stream["tpot_ms"]["p50"] is not None
    assert stream["output_tokens_per_s"] > 0 and stream["goodput"] == 1.0
    assert {"queue_wait", "upstream_connect", "ttft"} <= set(stream["server_ms"])
    assert plain["requests"] > 10 and plain["error_rate"] == 0 and plain["tpot_ms"]["p50"] is None
    assert bad["errors"] == {"invalid_api_key": bad["requests"]} and bad["requests"] > 0
    for suffix in ("ttft-cdf", "latency-time", "stages"):
        png = (tmp_path / "out" / f"e2e-{suffix}.png").read_bytes()
        width, height = struct.unpack(">II", png[16:24])  # the PNG header's size: a plot a person can read
        assert width >= 1000 and height >= 600, (suffix, width, height)
    # no terminal (a pipe here, as in CI): progress lines while it runs, not silence until the end
    assert re.search(r"e2e: \d+ s of 5 s, \d+ done", result.stderr), result.stderr
    assert "| stream |" in (tmp_path / "out" / "e2e.md").read_text()
