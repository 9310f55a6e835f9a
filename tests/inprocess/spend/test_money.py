"""The money path in-process: prices and their versions, the record a request leaves, the ledger's spool and its
replay, the four anomaly actions, budget reservations and settlement, and the reports' row maths. No process,
no socket: each piece is called as the pipeline calls it, with fakes only for what it writes to."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.auth import bearer, hash_key, identify, token_matches
from gateway.context import RequestContext
from gateway.endpoints import CHAT, COMPLETIONS, Endpoint
from gateway.errors import InvalidRequest, NotAuthenticated, OverBudget
from gateway.finance.reports import sum_rows, with_rates
from gateway.http.reports import parse_groups, parse_time
from gateway.ledger import prices as pricing
from gateway.ledger import times
from gateway.ledger.records import complete, draft, price
from gateway.ledger.writer import LedgerWriter
from gateway.openai_api import prepare
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Policy
from gateway.spend.alerts import Alerts
from gateway.spend.counters import NANO, MemoryCounters
from gateway.spend.service import Spend

MODEL = "m"
KEY = "tg-unit-key"


def snapshot(action: str = "alert", budget: float | None = None, **prices: Any) -> PolicySnapshot:
    tenant: dict[str, Any] = {"tier": "standard", "keys": ["sha256:" + hash_key(KEY)],
                              "anomaly": {"k": 10, "action": action, "default_baseline_usd": 0.0001,
                                          "min_samples": 1000}}
    if budget is not None:
        tenant["budget"] = {"limit_usd": budget, "period": "day"}
    policy = Policy.model_validate({
        "tenants": {"t": tenant},
        "models": {MODEL: {"pool": "p"}},
        "pools": {"p": {"workers": ["http://w1"]}},
        "prices": {"models": {MODEL: [
            {"effective": "2026-01-01", "input_per_m": 1.0, "output_per_m": 2.0},
            {"effective": "2026-06-01", "input_per_m": 3.0, "output_per_m": 4.0, "cached_input_per_m": 0.5},
        ]}, **prices},
    })
    return PolicySnapshot.build(policy, "test")


def context(snap: PolicySnapshot, **fields: Any) -> RequestContext:
    ctx = RequestContext("r1", snap, CHAT)
    ctx.tenant, ctx.model = snap.tenants["t"], MODEL
    for name, value in fields.items():
        setattr(ctx, name, value)
    return ctx


# -- prices -------------------------------------------------------------------------------------------------

def test_the_version_in_force_is_the_latest_effective_on_the_day() -> None:
    prices = snapshot().policy.prices
    assert pricing.version_on(prices, MODEL, date(2025, 12, 31)) is None, "no price before the first version"
    assert pricing.version_on(prices, MODEL, date(2026, 5, 31)).input_per_m == 1.0  # type: ignore[union-attr]
    assert pricing.version_on(prices, MODEL, date(2026, 6, 1)).input_per_m == 3.0  # type: ignore[union-attr]
    assert pricing.version_on(prices, "unpriced", date(2026, 6, 1)) is None


def test_cost_prices_cached_tokens_classes_batch_lines_and_cache_hits() -> None:
    prices = snapshot(class_multipliers={"premium": 2.0}, batch_api_discount=0.5, cache_hit_factor=0.1).policy.prices
    june = pricing.version_on(prices, MODEL, date(2026, 6, 1))
    assert june is not None
    usage = pricing.Usage(prompt_tokens=1000, completion_tokens=500, cached_tokens=400)
    fresh = (600 * 3.0 + 400 * 0.5 + 500 * 4.0) / 1e6
    assert pricing.cost(prices, june, usage, "standard", False, False) == pytest.approx(fresh)
    assert pricing.cost(prices, june, usage, "premium", False, False) == pytest.approx(2 * fresh)
    assert pricing.cost(prices, june, usage, "standard", True, False) == pytest.approx(0.5 * fresh)
    assert pricing.cost(prices, june, usage, "standard", False, True) == pytest.approx(0.1 * fresh)
    overcounted = pricing.Usage(prompt_tokens=10, completion_tokens=0, cached_tokens=50)
    assert pricing.cost(prices, june, overcounted, "standard", False, False) == pytest.approx(10 * 0.5 / 1e6), \
        "cached tokens never exceed the prompt"


def test_a_record_can_be_recomputed_from_its_price_version() -> None:
    prices = snapshot().policy.prices
    usage = pricing.Usage(100, 50)
    january = pricing.version_on(prices, MODEL, date(2026, 2, 1))
    assert january is not None
    version = pricing.version_id(MODEL, january)
    assert version == "m@2026-01-01"
    assert pricing.recompute(prices, version, usage, "standard", False, False) == \
        pricing.cost(prices, january, usage, "standard", False, False)


# -- the record ---------------------------------------------------------------------------------------------

def test_a_finished_request_is_priced_at_its_day_and_drafted_with_everything_finance_reads() -> None:
    snap = snapshot()
    ctx = context(snap, prompt_tokens=1000, completion_tokens=10, cached_tokens=200, status=200, key_id="key-abc")
    may = datetime(2026, 5, 20, 12, tzinfo=UTC).timestamp()
    cost, version = price(ctx, may)
    assert version == "m@2026-01-01" and cost == pytest.approx((1000 * 1.0 + 10 * 2.0) / 1e6)
    ctx.cost_usd, ctx.price_version = cost, version
    record = draft(ctx, may)
    assert record is not None
    fields = complete(record)
    assert fields["time"] == "2026-05-20T12:00:00.000000Z" == times.at(may)
    assert (fields["tenant"], fields["model"], fields["key_id"], fields["status"]) == ("t", MODEL, "key-abc", 200)
    assert (fields["prompt_tokens"], fields["completion_tokens"], fields["cached_tokens"]) == (1000, 10, 200)
    assert fields["cost_usd"] == cost and fields["price_version"] == version and fields["estimated"] is False


def test_an_unauthenticated_request_leaves_no_record_and_an_unpriced_one_costs_nothing() -> None:
    snap = snapshot()
    ctx = RequestContext("r", snap, CHAT)
    assert draft(ctx, 0.0) is None
    unpriced = context(snap, model="unpriced", prompt_tokens=10)
    assert price(unpriced, datetime(2026, 7, 1, tzinfo=UTC).timestamp()) == (0.0, None)


def test_the_ledger_time_format_sorts_as_time() -> None:
    moments = [datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), datetime(2026, 1, 2, 3, 4, 5, 7, tzinfo=UTC),
               datetime(2026, 10, 1, tzinfo=UTC)]
    texts = [times.sortable(m) for m in moments]
    assert texts == sorted(texts) and len({len(t) for t in texts}) == 1
    assert times.period_start("month", datetime(2026, 3, 17, 9, tzinfo=UTC).timestamp()) == \
        "2026-03-01T00:00:00.000000Z"
    assert times.period_start("day", datetime(2026, 3, 17, 9, tzinfo=UTC).timestamp()) == \
        "2026-03-17T00:00:00.000000Z"


# -- the spool ----------------------------------------------------------------------------------------------

class FakeStore:
    """A ledger store that fails while ``down`` is set, and keeps records by id (inserts are idempotent)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.down = False
        self.inserts = 0

    def insert(self, records: list[dict[str, Any]]) -> None:
        if self.down:
            raise ConnectionError("store down")
        self.inserts += 1
        for record in records:
            self.rows.setdefault(record["id"], record)

    def close(self) -> None:
        return None


def drafts(snap: PolicySnapshot, n: int, start: int = 0) -> list[Any]:
    out = []
    for i in range(start, start + n):
        ctx = context(snap, prompt_tokens=i, request_id=f"r{i}")
        record = draft(ctx, 1.0e9 + i)
        assert record is not None
        out.append(record)
    return out


def test_records_go_to_the_spool_while_the_store_is_down_and_are_replayed_once_when_it_is_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.ledger.writer.RETRY_STORE_S", 0.0)
    store, snap = FakeStore(), snapshot()
    writer = LedgerWriter(store, tmp_path / "spool.jsonl")  # type: ignore[arg-type]
    store.down = True
    for record in drafts(snap, 3):
        writer.append(record)
    writer.flush()
    spooled = (tmp_path / "spool.jsonl").read_bytes().splitlines()
    assert len(spooled) == 3 and store.rows == {} and not writer.store_ok
    for record in drafts(snap, 2, start=3):
        writer.append(record)
    writer.flush()  # still down: these join the spool, after the older ones
    assert len((tmp_path / "spool.jsonl").read_bytes().splitlines()) == 5
    store.down = False
    for record in drafts(snap, 1, start=5):
        writer.append(record)
    writer.flush()
    assert not (tmp_path / "spool.jsonl").exists()
    assert sorted(r["request_id"] for r in store.rows.values()) == [f"r{i}" for i in range(6)]
    writer.flush()
    assert len(store.rows) == 6, "nothing twice"


def test_a_replay_cut_short_and_redone_never_doubles_a_record(tmp_path: Path) -> None:
    """The spool is kept until its whole replay went in; a partial last line (a crash mid-write) is skipped."""
    store, snap = FakeStore(), snapshot()
    spool = tmp_path / "spool.jsonl"
    records = [complete(d) for d in drafts(snap, 4)]
    spool.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records) + b'{"id": "cut-off')
    store.rows[records[0]["id"]] = records[0]  # the first chunk of an earlier replay went in before a failure
    writer = LedgerWriter(store, spool)  # type: ignore[arg-type]
    writer.flush()
    assert len(store.rows) == 4 and not spool.exists()


def test_the_writer_thread_flushes_pending_records_on_stop(tmp_path: Path) -> None:
    store, snap = FakeStore(), snapshot()
    writer = LedgerWriter(store, tmp_path / "spool.jsonl", flush_interval_s=60)  # type: ignore[arg-type]
    writer.start()
    for record in drafts(snap, 5):
        writer.append(record)
    writer.stop()
    assert len(store.rows) == 5 and not any(t.name == "tollgate-ledger" for t in threading.enumerate())


# -- anomalies and budgets -----------------------------------------------------------------------------------

def spend_for(snap: PolicySnapshot) -> tuple[Spend, Alerts]:
    metrics = GatewayMetrics()
    alerts = Alerts(metrics, None)
    return Spend(metrics, alerts, None), alerts


async def admitted(spend: Spend, snap: PolicySnapshot, max_tokens: int, klass: str = "standard",
                   ) -> tuple[RequestContext, Any, str]:
    ctx = RequestContext("r", snap, CHAT)
    ctx.tenant, ctx.service_class = snap.tenants["t"], klass
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens})
    call = await prepare(ctx, body)
    ran_in = await spend.admit(ctx, call)
    return ctx, call, ran_in


def test_each_anomaly_action_does_what_it_says_and_a_normal_request_passes() -> None:
    """The baseline is 0.0001 USD and k = 10: a request whose worst case is above 0.001 USD is anomalous
    (output at 4 USD per million: over 250 tokens)."""
    async def main() -> None:
        for action in ("alert", "clamp", "reject", "downgrade"):
            snap = snapshot(action)
            spend, alerts = spend_for(snap)
            ctx, call, klass = await admitted(spend, snap, 10)  # 40 nano-USD a token: far below
            assert (klass, call.max_output, list(alerts.recent)) == ("standard", 10, []), action
            if action == "reject":
                with pytest.raises(InvalidRequest) as refused:
                    await admitted(spend, snap, 1000)
                assert refused.value.code == "cost_anomaly" and refused.value.param == "max_tokens"
            else:
                ctx, call, klass = await admitted(spend, snap, 1000)
                if action == "alert":
                    assert (klass, call.max_output) == ("standard", 1000)
                elif action == "clamp":
                    assert klass == "standard" and 1 <= call.max_output < 250
                    assert call.body["max_tokens"] == call.max_output
                    assert ctx.max_tokens_applied == f"clamped-anomaly; value={call.max_output}"
                else:
                    assert klass == "batch" and call.max_output == 1000, "downgraded, not clamped"
            alert = alerts.recent[-1]
            assert (alert["kind"], alert["action"], alert["tenant"]) == ("request_cost", action, "t")
    asyncio.run(main())


def test_a_reservation_bounds_concurrent_requests_and_settlement_swaps_it_for_the_cost() -> None:
    """Budget 0.01 USD; each request's worst case is 0.004 USD (1000 output tokens at 4 USD per million): two
    fit in flight, the third is refused until one settles."""
    async def main() -> None:
        snap = snapshot(budget=0.01)
        spend, _ = spend_for(snap)
        spend.baselines.seed("t", 1.0, 1000)  # a large baseline: no anomaly here
        first, _, _ = await admitted(spend, snap, 1000)
        second, _, _ = await admitted(spend, snap, 1000)
        with pytest.raises(OverBudget):
            await admitted(spend, snap, 1000)
        counters = spend.counters
        assert isinstance(counters, MemoryCounters)
        key = first.reservation.key  # type: ignore[attr-defined]
        assert counters._counters[key] == [0, 2 * first.reservation.amount]  # type: ignore[attr-defined]
        spend.settle(first, 0.0005)  # what it really cost
        assert counters._counters[key] == [math.ceil(0.0005 * NANO), second.reservation.amount]  # type: ignore
        third, _, _ = await admitted(spend, snap, 1000)  # room again
        spend.settle(second, 0.0)
        spend.settle(third, 0.001)
        assert counters._counters[key] == [math.ceil(0.0005 * NANO) + math.ceil(0.001 * NANO), 0]
    asyncio.run(main())


@pytest.fixture(params=["memory"])  # tests/process/spend/test_money.py runs the counters' tests on Redis too
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@contextlib.asynccontextmanager
async def opened(kind: str) -> AsyncIterator[Any]:
    """Budget counters of ``kind`` ("memory", or a Redis's URL: under a namespace of their own), in this event
    loop."""
    if kind == "memory":
        yield MemoryCounters()
        return
    from gateway.policy.schema import StatePolicy
    from gateway.spend.counters import RedisCounters
    from gateway.state import SharedState
    state = SharedState(StatePolicy(redis_url=kind, namespace=f"test-{os.urandom(4).hex()}"))
    try:
        yield RedisCounters(state)
    finally:
        await state.close()


def test_counters_need_a_seed_for_a_new_period_and_never_go_past_the_limit(kind: str) -> None:
    async def main() -> None:
        async with opened(kind) as counters:
            assert await counters.reserve("t:2026-01", "r1", 10, 100, None) is None, "a new period asks for its seed"
            assert await counters.reserve("t:2026-01", "r1", 10, 100, 85) == (True, 85, 10)
            assert await counters.reserve("t:2026-01", "r2", 6, 100, None) == (False, 85, 10), "85 + 10 + 6 > 100"
            assert await counters.settle("t:2026-01", "r1", 3) == (88, 0)
            assert await counters.settle("t:missing", "r9", 1) is None
    asyncio.run(main())


def test_a_settlement_without_a_reservation_still_counts(kind: str) -> None:
    """Admitted while Redis was down, or a priced cache hit: nothing reserved, the cost is spent all the same
    (Redis refused the old script's '-0' for it, and the cost never reached the counter)."""
    async def main() -> None:
        async with opened(kind) as counters:
            await counters.reserve("t:d", "r1", 10, 1000, 0)
            assert await counters.settle("t:d", None, 7) == (7, 10)
            assert await counters.settle("t:d", "unknown", 5) == (12, 10)
            assert await counters.settle("t:d", "r1", 0) == (12, 0)
    asyncio.run(main())


def test_what_settles_is_what_the_counter_holds_not_what_the_caller_believes(kind: str) -> None:
    """A reserve whose caller gave up (a timeout) is released by its id; a settle twice releases once; a
    counter that lost its reservations (Redis restarted, reseeded from the ledger) never goes below zero."""
    async def main() -> None:
        async with opened(kind) as counters:
            await counters.reserve("t:d", "late", 40, 1000, 0)  # the caller timed out and thinks it holds 0
            assert await counters.settle("t:d", "late", 0) == (0, 0)
            assert await counters.settle("t:d", "late", 0) == (0, 0), "released once"
            await counters.reserve("t:d", "a", 30, 1000, None)
            await counters.reserve("t:d", "b", 30, 1000, None)
            if isinstance(counters, MemoryCounters):
                counters._counters.clear()
            else:
                await counters.redis.delete(counters.prefix + "t:d")  # the counter is gone, the holds stay
            assert await counters.reserve("t:d", "c", 20, 1000, None) is None
            assert await counters.reserve("t:d", "c", 20, 1000, 100) == (True, 100, 20), "reseeded from the ledger"
            assert await counters.settle("t:d", "a", 5) == (105, 0), "a's hold is released from the new count, floored"
            assert await counters.settle("t:d", "c", 5) == (110, 0)
    asyncio.run(main())


# -- reports -------------------------------------------------------------------------------------------------

def test_report_rows_sum_and_carry_rates() -> None:
    rows = [{"requests": 4, "prompt_tokens": 100, "completion_tokens": 60, "cached_tokens": 10, "cost_usd": 0.002,
             "cache_hits": 1, "cache_saved_tokens": 5, "errors": 0},
            {"requests": 0, "prompt_tokens": None, "completion_tokens": None, "cached_tokens": None,
             "cost_usd": None, "cache_hits": None, "cache_saved_tokens": None, "errors": None}]
    total = with_rates(sum_rows(rows))
    assert total["requests"] == 4 and total["cost_usd"] == 0.002
    assert total["cost_per_1k_requests_usd"] == 0.5 and total["tokens_per_request"] == 40.0
    empty = with_rates(dict(rows[1]))
    assert empty["cost_usd"] == 0.0 and empty["cost_per_1k_requests_usd"] == 0.0 and empty["tokens_per_request"] == 0


def test_report_parameters_parse_to_ledger_times_or_refuse_clearly() -> None:
    assert parse_time("2026-03-05", end=False) == "2026-03-05T00:00:00.000000Z"
    assert parse_time("2026-03-05", end=True) == "2026-03-06T00:00:00.000000Z", "a date as 'to' takes the whole day"
    assert parse_time("2026-03-05T10:00:00+02:00", end=False) == "2026-03-05T08:00:00.000000Z"
    assert parse_time("2026-03-05T10:00:00", end=False) == "2026-03-05T10:00:00.000000Z", "no offset: UTC"
    with pytest.raises(InvalidRequest) as bad:
        parse_time("yesterday", end=True)
    assert bad.value.param == "to"
    assert parse_groups("tenant, model") == ["tenant", "model"]
    with pytest.raises(InvalidRequest):
        parse_groups("tenant,tenant")


# -- auth ----------------------------------------------------------------------------------------------------

def test_a_key_identifies_its_tenant_by_hash_and_nothing_else_does() -> None:
    snap = snapshot()
    tenant, key_id = identify(b"Bearer " + KEY.encode(), snap)
    assert tenant.name == "t" and key_id == "key-" + hash_key(KEY)[:12] and KEY not in key_id
    assert bearer(b"bearer  " + KEY.encode() + b" ") == KEY, "scheme case and spaces"
    for header, code in ((None, "missing_api_key"), (b"Basic abc", "missing_api_key"), (b"Bearer ", "missing_api_key"),
                         (b"Bearer tg-someone-else", "invalid_api_key")):
        with pytest.raises(NotAuthenticated) as refused:
            identify(header, snap)
        assert refused.value.code == code, header
    assert token_matches(b"Bearer secret", "sha256:" + hash_key("secret"))
    assert not token_matches(b"Bearer secret", "sha256:" + hash_key("other"))
    assert not token_matches(b"Bearer secret", None) and not token_matches(None, "sha256:" + hash_key("secret"))


def test_report_bounds_at_the_calendars_edge_are_open_ends_not_errors() -> None:
    """to=9999-12-31 (a day past it overflows) and a from in year 1 east of UTC (before year 1 in UTC)."""
    from gateway.ledger.stores import OPEN_END, OPEN_START
    assert parse_time("9999-12-31", end=True) == OPEN_END
    assert parse_time("9999-12-31T23:59:59-05:00", end=True) == OPEN_END
    assert parse_time("0001-01-01T00:00:00+01:00", end=False) == OPEN_START
    assert parse_time("0001-01-01", end=False) == "0001-01-01T00:00:00.000000Z"


# -- the worst case ------------------------------------------------------------------------------------------

def prepared(snap: PolicySnapshot, body: dict[str, Any], endpoint: Endpoint = CHAT) -> Any:
    async def main() -> Any:
        ctx = RequestContext("r", snap, endpoint)
        ctx.tenant = snap.tenants["t"]
        return await prepare(ctx, orjson.dumps(body))
    return asyncio.run(main())


def test_the_worst_case_bounds_what_any_body_can_use() -> None:
    """n and best_of, every prompt of a list, and text near one token a byte: the reserved tokens cover what the
    engine can produce and count (the old bound, bytes / 4 + max_tokens, covered 1/113 of n=128)."""
    from workers.sim.tokenizer import count_chat, count_text

    snap = snapshot()
    dense = "!?" * 2000  # punctuation: one token a character in the simulator's tokenizer, as near as BPE gets
    messages = [{"role": "user", "content": dense}]
    cases = [
        (CHAT, {"model": MODEL, "messages": messages, "max_tokens": 100}, count_chat(messages) + 100),
        (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "n": 128},
         count_chat([{"role": "user", "content": "hi"}]) + 100 * 128),
        (COMPLETIONS, {"model": MODEL, "prompt": ["say ." * 8] * 64, "max_tokens": 50},
         64 * count_text("say ." * 8) + 64 * 50),
        (COMPLETIONS, {"model": MODEL, "prompt": [dense, dense], "max_tokens": 10, "n": 2, "best_of": 3},
         2 * count_text(dense) + 2 * 3 * 10),
        (COMPLETIONS, {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 10}, 3 + 10),
    ]
    for endpoint, body, most in cases:
        call = prepared(snap, body, endpoint)
        assert call.worst_tokens >= most, (body.get("n"), call.worst_tokens, most)
        assert call.size // 4 + call.max_output < most or body.get("prompt") == [1, 2, 3], "the old bound fell short"


def test_a_reservation_prices_the_worst_case_and_the_anomaly_rule_the_usual_size() -> None:
    async def main() -> None:
        snap = snapshot(budget=1.0)
        spend, alerts = spend_for(snap)
        ctx = RequestContext("r", snap, CHAT)
        ctx.tenant = snap.tenants["t"]
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "n": 100}
        call = await prepare(ctx, orjson.dumps(body))
        await spend.admit(ctx, call)
        june = pricing.version_on(snap.policy.prices, MODEL, datetime.now(UTC).date())
        assert june is not None
        worst = pricing.cost(snap.policy.prices, june, pricing.Usage(call.size, 1000), "standard", False, False)
        assert ctx.reservation.amount == math.ceil(worst * NANO)  # type: ignore[attr-defined]
        assert alerts.recent and alerts.recent[-1]["action"] == "alert", "1,000 output tokens: 10x the usual"
    asyncio.run(main())


# -- alerts under a flood ----------------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_alerts_group_per_tenant_and_rule_and_webhooks_are_rate_limited() -> None:
    """1,100 refused requests are one alert with a count, and one webhook; a second tenant's alert stays listed."""
    from gateway.spend import alerts as module

    async def main() -> None:
        clock = Clock()
        alerts = Alerts(GatewayMetrics(), None, clock=clock)
        alerts.raise_alert("request_cost", "reject", "http://hook", tenant="quiet", worst_case_usd=1)
        for i in range(1_100):
            alerts.raise_alert("request_cost", "reject", "http://hook", tenant="loud", worst_case_usd=i)
        loud = [a for a in alerts.recent if a["tenant"] == "loud"]
        assert len(loud) == 1 and loud[0]["count"] == 1_100 and loud[0]["worst_case_usd"] == 1_099
        assert [a["tenant"] for a in alerts.recent] == ["quiet", "loud"]
        assert alerts._queue.qsize() == 2, "one delivery per group"
        clock.now += module.GROUP_S
        alerts.raise_alert("request_cost", "reject", "http://hook", tenant="loud")
        assert [a["count"] for a in alerts.recent if a["tenant"] == "loud"] == [1_100, 1], "a new window"
        clock.now += 60
        before = alerts._queue.qsize()
        for i in range(module.WEBHOOKS_PER_MINUTE + 5):  # many tenants at once
            alerts.raise_alert("budget", "alert", "http://hook", tenant=f"t{i}")
        hooks = [hook for _, hook in list(alerts._queue._queue)[before:]]  # type: ignore[attr-defined]
        assert hooks.count("http://hook") == module.WEBHOOKS_PER_MINUTE, "the rest are logged, not sent"
        for _ in range(module.KEEP_PER_TENANT + 50):  # one tenant's flood of distinct groups
            clock.now += module.GROUP_S
            alerts.raise_alert("spend_rate", "alert", None, tenant="loud")
        assert any(a["tenant"] == "quiet" for a in alerts.recent), "another tenant's alerts are kept"
    asyncio.run(main())


def test_a_baseline_does_not_follow_a_fast_ramp() -> None:
    """Reject above 10x the usual: stepping max_tokens up just under 10x at a time was let through to 2,000 in
    11 requests; now each request moves the baseline by at most 2x, so the ramp is refused within a few steps."""
    async def main() -> None:
        snap = snapshot("reject")
        spend, _ = spend_for(snap)
        refused_at = None
        for max_tokens in (1, 2, 5, 10, 25, 60, 150, 400, 900, 1500, 2000):
            try:
                await admitted(spend, snap, max_tokens)
            except InvalidRequest:
                refused_at = max_tokens
                break
        assert refused_at is not None and refused_at <= 400, refused_at
    asyncio.run(main())


def test_a_restarted_process_seeds_each_tenants_baseline_from_the_ledger() -> None:
    class Ledger:
        def __init__(self) -> None:
            self.queries = 0

        def totals(self, start: str, end: str, group_by: list[str], tenant: str | None) -> list[dict[str, Any]]:
            self.queries += 1
            return [{"requests": 2000, "cost_usd": 2000 * 0.002}]

    async def main() -> None:
        snap = snapshot("reject")
        ledger = Ledger()
        spend = Spend(GatewayMetrics(), Alerts(GatewayMetrics(), None), ledger)  # type: ignore[arg-type]
        await asyncio.gather(*(admitted(spend, snap, 4000) for _ in range(5)))  # 0.016 USD: under 10 x 0.002
        assert ledger.queries == 1, "one query per tenant, shared by its first requests"
        baseline = spend.baselines.baseline("t", snap.tenants["t"].anomaly)
        assert 0.002 < baseline < 0.003, "seeded at 0.002, then moved a little by five requests of 0.016"
    asyncio.run(main())
