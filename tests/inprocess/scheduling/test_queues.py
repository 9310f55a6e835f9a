"""Only gateway.scheduling writes a pool's state (queues.PoolState); everyone else reads its QueueView.

Read from the source, in the style of tests/test_structure.py: an assignment (plain, augmented, to an item) to
``<x>.<field>`` for a field of PoolState, or a call of one of its counting methods or of a mutating method of one of
its fields, on anything but ``self`` (a class's own field of the same name, such as UpstreamPool.workers)."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.policy.schema import Pool
from gateway.scheduling.flows import ACTIVE_S, Flow, Waiter
from gateway.scheduling.queues import PoolState, QueueView

GATEWAY = Path(__file__).resolve().parents[3] / "gateway"
FIELDS = frozenset(f.name for f in dataclasses.fields(PoolState))
COUNTING = frozenset({"take", "give", "arrive"})
MUTATING = frozenset({"append", "appendleft", "pop", "popleft", "clear", "update", "setdefault", "push", "remove",
                      "extend", "__setitem__", "__delitem__"})


def _field_of_state(node: ast.expr) -> bool:
    """``<x>.<field>`` (or an item of it) for a PoolState field, ``x`` not ``self``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr in FIELDS and \
        not (isinstance(node.value, ast.Name) and node.value.id == "self")


def state_writes(source: str) -> list[str]:
    """The lines of ``source`` that write what looks like a PoolState."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            for target in node.targets:
                targets.extend(target.elts if isinstance(target, ast.Tuple) else [target])
        elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets.extend(node.targets if isinstance(node, ast.Delete) else [node.target])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if (node.func.attr in COUNTING and not (isinstance(owner, ast.Name) and owner.id == "self")) or \
                    (node.func.attr in MUTATING and _field_of_state(owner)):
                found.append(ast.unparse(node))
        found.extend(ast.unparse(t) for t in targets if _field_of_state(t))
    return found


def test_nothing_outside_the_scheduler_writes_a_pools_state() -> None:
    writes = {str(path.relative_to(GATEWAY.parent)): state_writes(path.read_text())
              for path in sorted(GATEWAY.rglob("*.py")) if path.parent.name != "scheduling"}
    assert {module: lines for module, lines in writes.items() if lines} == {}


def test_the_check_sees_the_writes_it_forbids() -> None:
    """Positive control: how the pools used to hand a pool's state over on a reload, and the controller's own
    writes, are found; a class's own fields of the same names are not."""
    handed_over = """
pool.admission = current.admission
pool.admission.workers, pool.admission.spec = pool.workers, spec
state.granted += 1
state.grants[key] = 1
state.take(tenant, klass)
state.queues["standard"].push(waiter)
pool.admission.completions.append(now)
"""
    assert state_writes(handed_over) == [
        "pool.admission.workers", "pool.admission.spec", "state.granted", "state.grants[key]",
        "state.take(tenant, klass)", "state.queues['standard'].push(waiter)", "pool.admission.completions.append(now)"]
    assert state_writes("self.workers = workers\nself.spec = spec\nself.held.pop(key)\n") == []
    controller = (GATEWAY / "scheduling" / "controller.py").read_text()
    assert len(state_writes(controller)) > 10, "the controller's own writes are all seen"


def test_the_view_reads_the_queues_it_was_made_from() -> None:
    async def main() -> None:
        state = PoolState("p", [], Pool.model_validate({"workers": ["http://w0"]}))
        view = QueueView(state)
        assert view.depths() == {"premium": 0, "standard": 0, "batch": 0} and view.queued == 0
        flow = state.queues["batch"].arrive("batch", "t", 1.0, 0.0)
        state.queues["batch"].push(Waiter(None, flow, 10, 10, 0.0))  # type: ignore[arg-type]
        assert view.depths() == {"premium": 0, "standard": 0, "batch": 1} and view.queued == 1
    asyncio.run(main())


def test_a_flow_is_created_on_arrival_and_collected_when_idle_without_credit() -> None:
    """The registry keeps a flow while it holds, queues or asked within ACTIVE_S; an idle flow whose counter is
    above what a returning flow is lifted to is kept (collecting it would forgive what it was served), one at or
    below it goes; a returning flow starts at the least counter of the busy ones, less their requests in flight."""
    state = PoolState("p", [], Pool.model_validate({"workers": ["http://w0"]}))
    queue = state.queues["standard"]
    gone, ahead, busy = (queue.arrive("standard", t, 1.0, 100.0) for t in ("gone", "ahead", "busy"))
    state.take(busy, 1, 50, now=100.0)
    state.give(1, 70.0, now=100.0)  # its estimate corrected to the work done
    state.take(busy, 3, 50, now=100.0)
    state.take(ahead, 2, 500, now=100.0)
    state.give(2, 400.0, now=100.0)
    assert (busy.counter, busy.pending, ahead.counter, gone.counter) == (120, 50, 400, 0)
    state.collect(100.0 + ACTIVE_S - 0.1)
    assert set(queue.flows) == {"gone", "ahead", "busy"}, "all asked within ACTIVE_S"
    state.collect(100.0 + ACTIVE_S)
    assert set(queue.flows) == {"ahead", "busy"}, "idle, and no counter above the lift: collected"
    back = queue.arrive("standard", "gone", 1.0, 200.0)
    assert back is not gone and back.counter == 70, "a returning flow starts at the busy flows' least, less in flight"
    state.give(3, now=300.0)
    state.collect(300.0)
    assert queue.flows == {}, "none busy: every idle flow goes"


def test_weights_divide_the_charge() -> None:
    state = PoolState("p", [], Pool.model_validate({"workers": ["http://w0"]}))
    heavy = state.queues["premium"].arrive("premium", "h", 2.0, 0.0)
    state.take(heavy, 1, 100, now=0.0)
    state.give(1, 300.0, now=1.0)
    assert heavy.counter == 150 and heavy.held == 0 and state.granted == state.premium == 0


@st.composite
def grants(draw: st.DrawFn) -> list[tuple[float, int, float, float]]:
    """A flow's requests: (granted at, held for, estimate, work done), the work often far below the estimate (a
    prompt served from the prefix cache, an answer shorter than max_tokens)."""
    out, at = [], 0.0
    for _ in range(draw(st.integers(1, 12))):
        at += draw(st.floats(0.0, 5.0))
        estimate = draw(st.floats(1.0, 4096.0))
        out.append((at, draw(st.floats(0.0, 30.0)), estimate, draw(st.floats(0.0, 1.0)) * estimate))
    return out


def _recent_tokens_follow_the_work_done(requests: list[tuple[float, float, float, float]]) -> None:
    state = PoolState("p", [], Pool.model_validate({"workers": ["http://w0"]}))
    flow = state.queues["standard"].arrive("standard", "t", 2.0, 0.0)
    events = sorted([(at, 0, i) for i, (at, _, _, _) in enumerate(requests)] +
                    [(at + held, 1, i) for i, (at, held, _, _) in enumerate(requests)])
    taken: set[int] = set()
    released: set[int] = set()
    for now, kind, i in events:
        _, _, estimate, done = requests[i]
        if kind == 0:
            state.take(flow, i, estimate, now=now)
            taken.add(i)
        else:
            state.give(i, done, now=now)
            released.add(i)
        expected = sum((requests[j][3] if j in released else requests[j][2]) / 2.0
                       * math.exp(-(now - requests[j][0]) / ACTIVE_S)
                       for j in taken)
        assert flow.recent_tokens(now) == pytest.approx(expected, rel=1e-6, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(requests=grants())
def test_a_flows_recent_tokens_are_its_work_done_decayed_from_each_grant(
        requests: list[tuple[float, float, float, float]]) -> None:
    """What the headroom compares: each request counts its estimate (over the weight) while in flight and the
    work done once released, decayed from its grant with the ACTIVE_S time constant; never below zero."""
    _recent_tokens_follow_the_work_done(requests)


def test_the_recent_tokens_check_catches_an_undecayed_correction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: a release's correction counted at full weight (not decayed with its estimate) leaves a
    long request's flow below its work done, below zero when the work is far under the estimate."""
    long_request = [(0.0, 20.0, 1000.0, 100.0)]
    _recent_tokens_follow_the_work_done(long_request)
    original = Flow.account
    monkeypatch.setattr(Flow, "account", lambda self, now, held, tokens, charged_at:
                        original(self, now, held, tokens, now))
    with pytest.raises(AssertionError):
        _recent_tokens_follow_the_work_done(long_request)
