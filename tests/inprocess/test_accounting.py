"""accounting: each observer runs once per request, in the documented order, and one that raises stops none of
the others (above all not the ledger record)."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import pytest

from gateway import accounting, pipeline
from gateway.context import RequestContext, Trace
from gateway.endpoints import CHAT
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from gateway.ratelimit import Charge
from gateway.runtime import Gateway
from gateway.sink import BufferSink
from loadtest.harness.policy import build_policy as policy_dict

MODEL = "sim-llama-8b"
ORDER = ["price_of", "settle_spend", "settle_ratelimit", "record", "count", "end_span", "write_line"]


def snapshot() -> PolicySnapshot:
    return PolicySnapshot.build(Policy.model_validate(policy_dict(["http://127.0.0.1:9"])), "test")


def served(rid: str = "r1") -> RequestContext:
    """A finished request of the demo tenant: priced, rate-limit charged and traced, so every observer acts."""
    ctx = RequestContext(rid, snapshot(), CHAT)
    ctx.tenant = ctx.snapshot.tenants["demo"]
    ctx.model, ctx.status = MODEL, 200
    ctx.prompt_tokens, ctx.completion_tokens = 1000, 500
    ctx.charge = Charge("demo", 1, 2000, in_redis=False)
    ctx.trace = Trace(trace_id=1, parent_id=None, server_id=2, upstream_id=3, sampled=True)
    return ctx


def answered(metrics: GatewayMetrics) -> float:
    """Requests the metrics have counted so far."""
    return sum(s.value for family in metrics.registry.collect() if family.name == "tollgate_requests"
               for s in family.samples if s.name == "tollgate_requests_total")


class Parts:
    """Stand-ins for the spend service, the rate limiter, the ledger writer, the tracer and the log writer, each
    noting (in one list) what it was handed and what the others had done by then."""

    def __init__(self, failing: str | None = None) -> None:
        self.metrics = GatewayMetrics()
        self.calls: list[tuple[str, Any]] = []
        self.failing = failing

    def _note(self, name: str, what: Any) -> None:
        self.calls.append((name, what))
        if name == self.failing:
            raise RuntimeError(f"{name} is down")

    def settle(self, *args: Any) -> None:
        if len(args) == 2:  # Spend.settle(ctx, cost_usd)
            self._note("spend", args[1])
        else:  # RateLimiter.settle(charge, used_tokens, ran)
            self._note("ratelimit", args[1:])

    def append(self, record: Any) -> None:
        self._note("ledger", (record.fields["cost_usd"], answered(self.metrics)))

    def finish(self, ctx: RequestContext) -> None:
        self._note("trace", answered(self.metrics))

    def emit(self, line: dict[str, Any]) -> None:
        self._note("log", line["cost_usd"])

    def finisher(self) -> accounting.Finish:
        return accounting.Finish(accounting.observers(self.metrics, self, self, self, self,  # type: ignore[arg-type]
                                                      emit=self.emit))


def test_the_observers_run_in_order_and_the_price_comes_first() -> None:
    parts = Parts()
    finish = parts.finisher()
    assert [o.__name__ for o in finish.observers] == ORDER
    ctx = served()
    finish(ctx)
    cost = ctx.cost_usd
    assert cost > 0 and ctx.price_version is not None and ctx.timings.total is not None
    assert parts.calls == [("spend", cost), ("ratelimit", (1500, False)), ("ledger", (cost, 0)), ("trace", 1),
                           ("log", cost)], "priced before the settlements, counted after the record"


def test_without_a_ledger_or_a_tracer_those_observers_are_left_out() -> None:
    names = [o.__name__ for o in accounting.observers(GatewayMetrics())]
    assert names == [n for n in ORDER if n in ("price_of", "count", "write_line")]


@pytest.mark.parametrize("failing", ["spend", "ratelimit", "trace"])
def test_an_observer_that_raises_stops_none_of_the_others(failing: str) -> None:
    parts = Parts(failing)
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    logger = logging.getLogger("tollgate.accounting")
    logger.addHandler(handler)
    try:
        ctx = served("broken")
        parts.finisher()(ctx)
    finally:
        logger.removeHandler(handler)
    assert [name for name, _ in parts.calls] == ["spend", "ratelimit", "ledger", "trace", "log"]
    assert ("ledger", (ctx.cost_usd, 0)) in parts.calls, "the ledger record is written all the same"
    assert answered(parts.metrics) == 1
    assert len(seen) == 1 and seen[0].exc_info is not None and "broken" in seen[0].getMessage()


def test_the_lifecycle_runs_each_of_the_gateways_observers_once_per_request() -> None:
    async def main() -> None:
        gw = Gateway(PolicyStore(snapshot()))
        runs: dict[str, int] = {}

        def counted(observe: accounting.Observer) -> accounting.Observer:
            @functools.wraps(observe)
            def wrapper(ctx: RequestContext, finished_at: float) -> None:
                runs[observe.__name__] = runs.get(observe.__name__, 0) + 1
                observe(ctx, finished_at)
            return wrapper
        gw.finish.observers = tuple(counted(o) for o in gw.finish.observers)
        for i in range(3):
            ctx = RequestContext(f"r{i}", gw.store.current, CHAT)
            ctx.tenant = gw.store.current.tenants["demo"]
            sink = BufferSink()
            async with pipeline.Lifecycle(gw, ctx, sink):
                await pipeline.run(gw, ctx, b"not json", sink)
            assert sink.status == 400 and ctx.timings.total is not None
        assert runs == {name: 3 for name in ("price_of", "settle_spend", "settle_ratelimit", "count", "write_line")}
        assert answered(gw.metrics) == 3
    asyncio.run(main())
