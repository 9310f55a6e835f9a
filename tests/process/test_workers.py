"""`tollgate serve --workers N`: processes on one port, sharing the data directory; restarted when one dies."""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.auth import hash_key
from gateway.policy.schema import Policy
from gateway.scheduling.capacity import worker_slots
from gateway.state.replicas import Share
from gateway.transport.http1 import Client
from loadtest.harness import procs
from tests.conftest import DEMO_KEY, Proc, patient, policy_dict, wait_for
from tests.fakes import live_worker
from workers.process import free_port

MODEL = "sim-llama-8b"


@pytest.fixture
def serve_workers(tmp_path: Path) -> Iterator[Callable[[dict[str, object], int], Proc]]:
    started: list[Proc] = []

    def start(policy: dict[str, object], n: int) -> Proc:
        port = free_port()
        path = tmp_path / f"policy-{port}.yaml"
        path.write_text(yaml.safe_dump(policy))
        proc = procs.start([sys.executable, "-m", "gateway", "serve", "--policy", str(path), "--port", str(port),
                            "--data-dir", str(tmp_path / "data"), "--workers", str(n)], port,
                           tmp_path / f"serve-{port}.log", "/readyz", timeout=60)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.process.send_signal(signal.SIGTERM)
        try:
            proc.process.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def children(parent: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in out]


def ask(url: str, i: int) -> int:
    return httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {DEMO_KEY}"}, timeout=30,
                      json={"model": MODEL, "max_tokens": 4,
                            "messages": [{"role": "user", "content": f"q{i}"}]}).status_code


def test_two_processes_serve_one_port_and_one_is_restarted(start_sim: Callable[..., Proc],
                                                            serve_workers: Callable[..., Proc],
                                                            tmp_path: Path) -> None:
    sim = start_sim("--decode-base-ms", "1")
    gateway = serve_workers(patient(policy_dict([sim.url])), 2)
    assert wait_for(lambda: len(children(gateway.pid)) == 2, timeout=30)
    with ThreadPoolExecutor(16) as pool:
        assert set(pool.map(lambda i: ask(gateway.url, i), range(200))) == {200}

    # both processes answered: the ledger (one SQLite file for both) has records from two writers
    def writers() -> set[str]:
        with sqlite3.connect(tmp_path / "data" / "ledger.sqlite3") as db:
            return {row[0].rsplit("-", 1)[0] for row in db.execute("SELECT id FROM ledger")}
    assert wait_for(lambda: len(writers()) == 2, timeout=10), writers()

    # a batch created through any process is run to the end (its lines claimed by whichever process has room)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY, max_retries=0)
    lines = b"".join(json.dumps({"custom_id": f"w{i}", "method": "POST", "url": "/v1/chat/completions",
                                 "body": {"model": MODEL, "max_tokens": 4,
                                          "messages": [{"role": "user", "content": f"line {i}"}]}}).encode() + b"\n"
                     for i in range(10))
    uploaded = client.files.create(file=("w.jsonl", io.BytesIO(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert wait_for(lambda: client.batches.retrieve(batch.id).status == "completed", timeout=30)

    # one process dies: the supervisor starts another; the port keeps answering
    victim = children(gateway.pid)[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: len(children(gateway.pid)) == 2 and victim not in children(gateway.pid), timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and ask(gateway.url, 0) != 200:
        time.sleep(0.2)
    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(lambda i: ask(gateway.url, i), range(50))) == {200}


def test_budgets_need_shared_counters_with_several_processes(tmp_path: Path) -> None:
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["tenants"]["capped"] = {"tier": "standard", "keys": ["sha256:" + hash_key("tg-test-c")],
                                   "budget": {"period": "day", "limit_usd": 1}}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--policy", str(path), "--port",
                           str(free_port()), "--data-dir", str(tmp_path / "d"), "--workers", "2"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "state.redis_url" in done.stderr


def test_each_process_takes_its_share_of_a_workers_limit() -> None:
    snap = Policy.model_validate({"allow_empty": True, "pools": {"p": {"workers": ["http://w"]}}})
    spec, scheduling = snap.pools["p"], snap.scheduling
    worker = live_worker("http://w", scraped_at=100.0, limit=5)
    shares = [worker_slots(worker, spec, scheduling, 100.5, Share(i, 2)) for i in range(2)]
    assert shares == [3, 2] and sum(shares) == 5, "two processes never hand it more than it runs"
    assert worker_slots(worker, spec, scheduling, 100.5) == 5
    many = [worker_slots(worker, spec, scheduling, 100.5, Share(i, 7)) for i in range(7)]
    assert many == [1] * 7, "more processes than slots: one each (two wait in the engine's queue, not in ours)"
    assert worker_slots(worker, spec, scheduling, 100.5, Share(0, 2, ready=False)) == 0, "a newcomer waits"
    worker.agreed.excess = 2  # another process still holds two beyond its (shrunk) part
    assert worker_slots(worker, spec, scheduling, 100.5, Share(1, 2)) == 0, "room left for the others to drain"


def test_each_replica_serves_in_front_of_an_engine_that_runs_one_request(start_sim: Callable[..., Proc],
                                                                       start_gateway: Callable[..., Proc]) -> None:
    """Two gateways share one Redis in front of an engine that runs one request at a time (a small CPU engine's
    max_num_seqs). Once a flood through one of them has shown that limit and both agreed on it, each still serves:
    a replica with no part of the worker would hold its requests until their deadline while the engine idled."""
    from tests.conftest import ADMIN_TOKEN, REDIS_URL

    sim = start_sim("--max-num-seqs", "1", "--decode-base-ms", "10", "--decode-per-seq-ms", "0",
                    "--mean-output-tokens", "0")
    policy = policy_dict([sim.url])
    policy["state"] = {"redis_url": REDIS_URL, "namespace": f"one-seq-{os.getpid()}-{time.monotonic_ns()}"}
    a, b = start_gateway(policy), start_gateway(policy)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "count"}], "max_tokens": 24}

    def ask(gw: Proc) -> int:
        return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30,
                          headers={"authorization": f"Bearer {DEMO_KEY}"}).status_code

    def main_pool(gw: Proc) -> dict[str, Any]:
        return httpx.get(gw.url + "/admin/queues", timeout=10,  # type: ignore[no-any-return]
                         headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()["pools"]["main"]

    def agreed_on_one() -> bool:
        views = [main_pool(gw) for gw in (a, b)]
        return all(v["agreed_limits"] == {sim.url: 1} and v["share"]["of"] == 2 and v["share"]["ready"]
                   for v in views)

    deadline = time.monotonic() + 60
    with ThreadPoolExecutor(4) as pool:  # four at once through a: the engine runs one and queues the rest
        while not agreed_on_one():
            assert time.monotonic() < deadline, ("the engine's limit of one was learned and agreed", main_pool(a))
            assert all(status in (200, 429) for status in pool.map(lambda _: ask(a), range(4)))
    # until a's next heartbeat, b still sees the flood a held beyond its new part and leaves that room to drain
    assert wait_for(lambda: agreed_on_one() and not any(main_pool(gw)["others_excess"] for gw in (a, b)),
                    timeout=30), (main_pool(a), main_pool(b))
    assert [ask(a), ask(b)] == [200, 200], "each replica has a part of the worker"


@pytest.mark.parametrize("metrics", ["missing", "hang", "huge"])
def test_an_engine_whose_metrics_say_nothing_is_served_in_full(start_sim: Callable[..., Any],
                                                                start_gateway: Callable[..., Any],
                                                                metrics: str) -> None:
    """An engine without vLLM's /metrics (404), with one that hangs, or with a 50 MB one: it is admitted, every
    one of three waves of 48 streams gets through, and its limit is learned from its answers above where it
    starts (before: stuck at 8 with most requests refused, and a hanging /metrics kept the worker out of routing
    altogether). The queue may hold a burst for as long as it needs (``patient``): with 48 client threads on two
    shared cores every answer is slow, and whether a 640 ms deadline holds is a benchmark's question
    (bench_no_metrics), not this test's."""
    from tests.conftest import ADMIN_TOKEN, DEMO_KEY, patient, policy_dict

    sim = start_sim("--metrics", metrics, "--max-num-seqs", "64", "--decode-base-ms", "10", "--decode-per-seq-ms", "0")
    policy = patient(policy_dict([sim.url]))
    policy["pools"]["main"].update(max_inflight_per_worker=256, scrape_interval_s=0.2)
    gw = start_gateway(policy)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "count"}], "max_tokens": 24, "ignore_eos": True,
            "stream": True}

    def stream(_: int) -> int | tuple[int, bytes]:
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=60,
                          headers={"authorization": f"Bearer {DEMO_KEY}"}) as reply:
            text = reply.read()
            return reply.status_code if reply.status_code == 200 else (reply.status_code, text[:300])
    limits = []
    with ThreadPoolExecutor(48) as pool:
        for _ in range(3):  # three waves: the first on a fresh gateway
            statuses = list(pool.map(stream, range(48)))
            assert statuses == [200] * 48, ([s for s in statuses if s != 200][:3],
                                            [line for line in gw.log.read_text().splitlines() if "warn" in line][-5:])
            queues = httpx.get(gw.url + "/admin/queues", timeout=10,
                               headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()["pools"]["main"]
            limits.append(max(queues["stream_limits"].values()))
    assert max(limits) > 8, ("learned above where it starts", limits)


def test_a_metrics_page_in_many_pieces_is_read_whole() -> None:
    """The load gauges may come late in a page larger than one read (vLLM lists them after histograms)."""
    import asyncio

    from aiohttp import web

    from gateway.fleet.observe import scrape
    from tests.fakes import live_worker

    page = (b"# filler\n" + b"vllm:some_histogram_bucket{le=\"1\"} 1\n" * 20_000
            + b"vllm:num_requests_running{model_name=\"m\"} 3.0\nvllm:num_requests_waiting{model_name=\"m\"} 2.0\n")

    async def main() -> tuple[float, float]:
        async def metrics(request: web.Request) -> web.StreamResponse:
            reply = web.StreamResponse()
            await reply.prepare(request)
            for i in range(0, len(page), 4096):  # in pieces, as a slow exporter writes
                await reply.write(page[i:i + 4096])
                await asyncio.sleep(0)
            return reply
        async def health(request: web.Request) -> web.Response:
            return web.Response(text="")
        app = web.Application()
        app.add_routes([web.get("/health", health), web.get("/metrics", metrics)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        worker = live_worker(f"http://127.0.0.1:{port}")
        client = Client(2, 60.0, 5.0, 5.0)
        await scrape(worker, client, 5.0)
        client.close()
        await runner.cleanup()
        return worker.observed.running, worker.observed.waiting

    assert asyncio.run(main()) == (3.0, 2.0)
