"""Finance builds off the event loop, one at a time: a second build while one runs is a 503 with Retry-After (the
routes' and the finance page's), the gate is given back when the build ends whatever became of its caller, a
store that fails is the ledger's 503, and a spooled body reads back byte for byte, whole or streamed."""

from __future__ import annotations

import asyncio
import csv
import io
import sqlite3
import threading
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.errors import Conflict, Unavailable
from gateway.finance import heavy
from gateway.http.app import HotPaths, create_app
from gateway.http.responses import spooled
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import FINANCE_TOKEN, policy_dict

FINANCE = {"authorization": f"Bearer {FINANCE_TOKEN}"}


def blocked(started: threading.Event, release: threading.Event) -> str:
    """A build that holds the report thread until ``release`` is set; it names the thread it ran on."""
    started.set()
    release.wait()
    return threading.current_thread().name


def test_a_second_build_while_one_runs_is_refused_and_the_first_runs_on_the_report_thread() -> None:
    async def main() -> None:
        started, release = threading.Event(), threading.Event()
        first = asyncio.create_task(heavy.build("first", blocked, started, release))
        await asyncio.to_thread(started.wait)
        assert heavy.busy()
        with pytest.raises(Unavailable) as refused:
            await heavy.build("second", len, "never run")
        assert refused.value.code == "reports_busy" and refused.value.retry_after_s == heavy.RETRY_AFTER_S
        release.set()
        assert (await first).startswith(heavy.THREAD) and threading.current_thread().name == "MainThread"
        assert not heavy.busy() and await heavy.build("third", len, "abc") == 3
    asyncio.run(main())


def test_the_gate_is_given_back_when_the_build_ends_not_when_its_caller_leaves() -> None:
    async def main() -> None:
        started, release = threading.Event(), threading.Event()
        caller = asyncio.create_task(heavy.build("left", blocked, started, release))
        await asyncio.to_thread(started.wait)
        caller.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert heavy.busy(), "the build still runs on its thread: the gate is its"
        ended = asyncio.get_running_loop().run_in_executor(heavy._executor, lambda: None)  # queued behind it
        release.set()
        await ended
        assert not heavy.busy()
    asyncio.run(main())


def test_a_store_failure_is_the_ledgers_503_an_outcome_passes_and_a_bug_is_no_outage() -> None:
    def failing(exc: Exception) -> None:
        raise exc

    async def main() -> None:
        with pytest.raises(Unavailable) as down:
            await heavy.build("down", failing, sqlite3.OperationalError("database is locked"))
        assert down.value.code == "ledger_unavailable"
        with pytest.raises(Conflict):
            await heavy.build("conflict", failing, Conflict("closed already", "month_closed"))
        with pytest.raises(KeyError):
            await heavy.build("bug", failing, KeyError("tenant"))
        assert not heavy.busy(), "given back each time"
    asyncio.run(main())


def app(data_dir: Path) -> HotPaths:
    policy = Policy.model_validate(policy_dict(["http://127.0.0.1:9"], gpu_usd_per_hour=3.6))
    return create_app(PolicyStore(PolicySnapshot.build(policy, "test")), data_dir)


def test_every_finance_build_answers_503_with_retry_after_while_another_runs(tmp_path: Path) -> None:
    made = app(tmp_path)
    asks = {"statement": "/admin/statements?month=2026-10&format=xlsx", "costs": "/admin/reports/costs?group_by=tag",
            "gpu": "/admin/reports/gpu?format=csv", "page": "/reports?days=7"}

    async def main() -> tuple[dict[str, httpx.Response], dict[str, httpx.Response]]:
        async with made.app.router.lifespan_context(made.app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=made), base_url="http://gateway") as client:  # type: ignore[arg-type]
            started, release = threading.Event(), threading.Event()
            holder = asyncio.create_task(heavy.build("holder", blocked, started, release))
            await asyncio.to_thread(started.wait)
            busy = {name: await client.get(path, headers=FINANCE) for name, path in asks.items()}
            health = await client.get("/healthz")
            assert health.status_code == 200, "the event loop answers while a build runs"
            release.set()
            await holder
            return busy, {name: await client.get(path, headers=FINANCE) for name, path in asks.items()}
    busy, after = asyncio.run(main())
    for name, reply in busy.items():
        assert reply.status_code == 503 and reply.headers["retry-after"] == str(heavy.RETRY_AFTER_S), name
    for name in ("statement", "costs", "gpu"):
        assert busy[name].json()["error"]["code"] == "reports_busy", name
    assert 'data-testid="busy"' in busy["page"].text and busy["page"].headers["content-type"].startswith("text/html")
    assert {name: reply.status_code for name, reply in after.items()} == dict.fromkeys(asks, 200)


def test_a_spooled_body_reads_back_whole_or_streamed() -> None:
    rows = [{"tenant": f"t{i}", "cost": i / 7, "note": "a,b\n\"c\""} for i in range(4501)]
    expected = io.StringIO()
    writer = csv.DictWriter(expected, ["tenant", "cost", "note"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)

    small, large = heavy.Spool(), heavy.Spool()
    small.csv(["tenant", "cost", "note"], rows)
    assert small.size == len(expected.getvalue().encode())
    for n in (0, 1, 2000, 2001, 4500):
        listed = heavy.Spool()
        listed.json_list(iter(rows[:n]))
        listed.file.seek(0)
        assert orjson.loads(listed.file.read()) == rows[:n], n
    blob = bytes(range(256)) * (heavy.SPOOL_MEMORY // 256 * 3 + 5)
    large.write(blob[:1000])
    large.write(blob[1000:])

    async def read(spool: heavy.Spool) -> tuple[Any, bytes]:
        response = spooled(spool, "text/plain", {"x-test": "1"})
        if hasattr(response, "body_iterator"):
            return "streamed", b"".join([chunk async for chunk in response.body_iterator])  # type: ignore[misc]
        return int(response.headers["content-length"]), bytes(response.body)
    assert asyncio.run(read(small)) == (small.size, expected.getvalue().encode())
    assert asyncio.run(read(large)) == ("streamed", blob), "past SPOOL_MEMORY: from the file, in chunks"
    assert large.file.closed


@pytest.mark.parametrize("path", ["/admin/reports/costs?group_by=tenant,tag&format=csv",
                                  "/admin/statements?month=2026-10&format=xlsx"])  # a workbook openpyxl writes
def test_a_report_past_the_body_bound_is_a_400_naming_what_to_narrow(tmp_path: Path, path: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A build that would write past MAX_BODY_BYTES stops there: a 400 ``report_too_large``, the spool dropped,
    the gate given back; the same report under the bound is answered."""
    made = app(tmp_path)

    async def main() -> tuple[httpx.Response, httpx.Response]:
        async with made.app.router.lifespan_context(made.app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=made), base_url="http://gateway") as client:  # type: ignore[arg-type]
            whole = await client.get(path, headers=FINANCE)
            monkeypatch.setattr(heavy, "MAX_BODY_BYTES", len(whole.content) - 1)
            return whole, await client.get(path, headers=FINANCE)
    whole, refused = asyncio.run(main())
    assert whole.status_code == 200 and whole.content
    if path.endswith("xlsx"):
        assert whole.content.startswith(b"PK") and int(whole.headers["content-length"]) == len(whole.content)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "report_too_large" and "narrow" in error["message"], error
    assert not heavy.busy()
