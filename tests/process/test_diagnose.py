"""`tollgate diagnose` names three staged faults correctly, and none on a healthy setup."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator

import aiohttp
import pytest
from aiohttp import web

from gateway.ops import diagnose
from tests.conftest import DEMO_KEY, ROOT, Proc, patient, policy_dict
from workers.process import free_port

MODEL = "sim-llama-8b"


def problems(report: diagnose.Report) -> set[str]:
    return {f.check for f in report.problems}


def run(url: str, direct: str | None = None) -> diagnose.Report:
    return asyncio.run(diagnose.run(url, DEMO_KEY, MODEL, direct))


@pytest.fixture
def buffering_proxy() -> Iterator[Callable[[str], str]]:
    """A proxy that reads the whole answer before sending any of it (as a buffering hop would)."""
    runners: list[web.AppRunner] = []
    loops: list[asyncio.AbstractEventLoop] = []

    def start(upstream: str) -> str:
        import threading

        port = free_port()
        ready = threading.Event()

        async def forward(request: web.Request) -> web.Response:
            async with aiohttp.ClientSession() as session, session.request(
                    request.method, upstream + request.path_qs, data=await request.read(),
                    headers={k: v for k, v in request.headers.items() if k.lower() in ("authorization",
                                                                                     "content-type")}) as r:
                body = await r.read()  # all of it, then send
                return web.Response(body=body, status=r.status, content_type=r.content_type)

        def serve() -> None:
            loop = asyncio.new_event_loop()
            loops.append(loop)
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", forward)
            runner = web.AppRunner(app)
            runners.append(runner)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
            ready.set()
            loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        ready.wait(10)
        return f"http://127.0.0.1:{port}"

    yield start
    for loop in loops:
        loop.call_soon_threadsafe(loop.stop)


def test_healthy_setup_reports_no_problem(start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc]) -> None:
    sim = start_sim("--decode-base-ms", "8", "--prefill-per-token-ms", "0.01")  # prefill too quick to crowd
    gateway = start_gateway(policy_dict([sim.url]))
    report = run(gateway.url, sim.url)
    assert problems(report) & {"buffering", "upstream keep-alive", "long prompts crowd short ones"} == set(), \
        report.text()
    assert any(f.check == "slowest stage" for f in report.findings)


def test_a_buffering_proxy_in_front(start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc],
                                    buffering_proxy: Callable[[str], str]) -> None:
    sim = start_sim("--decode-base-ms", "8")
    gateway = start_gateway(policy_dict([sim.url]))
    report = run(buffering_proxy(gateway.url))
    assert "buffering" in problems(report), report.text()
    assert report.problems[0].check == "buffering" or "proxy_buffering off" in report.text()


def test_keep_alive_disabled_to_the_workers(start_gateway: Callable[..., Proc],
                                            start_sim: Callable[..., Proc]) -> None:
    sim = start_sim("--decode-base-ms", "8")
    gateway = start_gateway(policy_dict([sim.url], keepalive_s=0.001))  # idle connections closed at once
    report = run(gateway.url, sim.url)
    assert "upstream keep-alive" in problems(report), report.text()
    assert "buffering" not in problems(report)


def test_long_prompts_crowding_short_ones(start_gateway: Callable[..., Proc],
                                          start_sim: Callable[..., Proc]) -> None:
    # a worker whose prefill is slow and not chunked: a long prompt stalls every other sequence's next step
    sim = start_sim("--decode-base-ms", "8", "--prefill-per-token-ms", "0.6", "--max-num-batched-tokens", "65536")
    gateway = start_gateway(patient(policy_dict([sim.url])))  # the short probes queue, never shed on a forecast
    report = run(gateway.url, sim.url)
    assert "long prompts crowd short ones" in problems(report), report.text()


def test_the_command_prints_the_report_and_exits_1_on_a_problem(
        start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc],
        buffering_proxy: Callable[[str], str]) -> None:
    sim = start_sim("--decode-base-ms", "8")
    gateway = start_gateway(policy_dict([sim.url]))
    done = subprocess.run([sys.executable, "-m", "gateway", "diagnose", buffering_proxy(gateway.url), "--key",
                           DEMO_KEY, "--model", MODEL], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("Where the time goes: buffering")


def test_with_the_cache_on_it_measures_the_worker_not_the_cache(start_gateway: Callable[..., Proc],
                                                               start_sim: Callable[..., Proc]) -> None:
    """Every probe is a fresh question asked past the cache, marked so the tenant's anomaly rule ignores it and
    reports show it apart; what it could not measure is said."""
    import httpx

    from gateway.auth import hash_key
    from tests.conftest import FINANCE_TOKEN, ledger_records

    sim = start_sim("--decode-base-ms", "4")
    policy = policy_dict([sim.url])
    policy["server"]["metrics_token_sha256"] = "sha256:" + hash_key("tg-test-metrics")
    policy["cache"] = {"enabled": True, "semantic_languages": [], "default_temperature": 0.0,
                       "audit": {"enabled": False}}
    policy["tiers"]["standard"]["anomaly"] = {"k": 2.0, "action": "alert"}  # a long prompt is an anomaly here
    gateway = start_gateway(policy)
    report = asyncio.run(diagnose.run(gateway.url, DEMO_KEY, MODEL, None, "tg-test-metrics"))
    assert report.findings, report.text()
    records = ledger_records(gateway.url, FINANCE_TOKEN, count=16)  # 6 + 3 alone + 4 long + 3 beside them
    assert len(records) == 16
    assert {r["cache"] for r in records} <= {"bypass", None}, {r["cache"] for r in records}
    assert {r["tags"] for r in records} == {"source=diagnose"}
    alerts = httpx.get(gateway.url + "/admin/anomalies", headers={"Authorization": "Bearer tg-test-admin-token"})
    assert alerts.status_code == 200 and alerts.json()["data"] == [], alerts.text
    said = {f.check: f.reading for f in report.findings}
    assert said["proxy overhead"] is said["worker engine"] is diagnose.Reading.NOT_MEASURED
    # without the operator's token its requests are the tenant's: the report says so
    plain = asyncio.run(diagnose.run(gateway.url, DEMO_KEY, MODEL, None, None))
    assert any(f.check == "cost anomalies" for f in plain.findings)
