"""Only gateway.scheduling writes a pool's state (queues.PoolState); everyone else reads its QueueView.

Read from the source, in the style of tests/test_structure.py: an assignment (plain, augmented, to an item) to
``<x>.<field>`` for a field of PoolState, or a call of one of its counting methods or of a mutating method of one of
its fields, on anything but ``self`` (a class's own field of the same name, such as UpstreamPool.workers)."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
from pathlib import Path

from gateway.policy.schema import Pool
from gateway.scheduling.queues import FORGET_S, PoolState, QueueView, Waiter

GATEWAY = Path(__file__).resolve().parents[3] / "gateway"
FIELDS = frozenset(f.name for f in dataclasses.fields(PoolState))
COUNTING = frozenset({"take", "give", "arrived", "forget_idle"})
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
state.held[tenant] = 1
state.take(tenant, klass)
state.queues["standard"].push(waiter)
pool.admission.completions.append(now)
"""
    assert state_writes(handed_over) == [
        "pool.admission.workers", "pool.admission.spec", "state.granted", "state.held[tenant]",
        "state.take(tenant, klass)", "state.queues['standard'].push(waiter)", "pool.admission.completions.append(now)"]
    assert state_writes("self.workers = workers\nself.spec = spec\nself.held.pop(key)\n") == []
    controller = (GATEWAY / "scheduling" / "controller.py").read_text()
    assert len(state_writes(controller)) > 10, "the controller's own writes are all seen"


def test_the_view_reads_the_queues_it_was_made_from() -> None:
    async def main() -> None:
        state = PoolState("p", [], Pool.model_validate({"workers": ["http://w0"]}))
        view = QueueView(state)
        assert view.depths() == {"premium": 0, "standard": 0, "batch": 0} and view.queued == 0
        state.queues["batch"].push(Waiter(None, "t", 1.0, 10, 10, 0.0))  # type: ignore[arg-type]
        assert view.depths() == {"premium": 0, "standard": 0, "batch": 1} and view.queued == 1
    asyncio.run(main())


def test_a_tenant_has_stopped_after_many_of_its_own_gaps() -> None:
    """A flood asking every 50 ms is gone after a second of silence; a tenant asking every 2 s is still there
    after 10 s; one seen once keeps the minute."""
    state = PoolState("p", [], Pool.model_validate({"workers": ["http://w0"]}))
    for i in range(40):
        state.asked("premium", "flood", 100.0 + 0.05 * i)
    for i in range(5):
        state.asked("premium", "slow", 100.0 + 2.0 * i)
    state.asked("premium", "once", 100.0)
    assert sorted(state.active_in("premium", 102.0)) == ["flood", "once", "slow"]
    assert sorted(state.active_in("premium", 103.5)) == ["once", "slow"], "1.5 s is 30 of the flood's gaps"
    assert sorted(state.active(118.0)["premium"]) == ["flood", "once", "slow"], "the heartbeat keeps the minute"
    assert state.active_in("premium", 161.0) == [], "none past the minute"


def test_a_pool_forgets_tenants_long_idle_but_not_one_holding_a_slot() -> None:
    """What a pool keeps per tenant is bounded by its recent tenants: one that has not asked for FORGET_S is
    dropped (gaps, overlaps, arrivals, hold times, a virtual time the class has caught up with); one still
    holding a slot, queued, or asking, is kept."""
    async def main() -> None:
        state = PoolState("p", [], Pool.model_validate({"workers": ["http://w0"]}))
        for i, tenant in enumerate(("gone", "holding", "recent")):
            for j in range(3):
                state.asked("premium", tenant, 100.0 + j)
                state.arrived("premium", tenant, 100.0 + j)
            state.take(tenant, "premium", i, 102.0)
        state.give("gone", "premium", 0, 103.0)
        state.give("recent", "premium", 2, 103.0)
        state.asked("standard", "waiting", 100.0)
        state.arrived("standard", "waiting", 100.0)
        state.queues["standard"].push(Waiter(None, "waiting", 1.0, 10, 10, 100.0))  # type: ignore[arg-type]
        queue = state.queues["premium"]
        queue.virtual.update({"gone": 5.0, "holding": 5.0, "ahead": 12.0})
        queue.now = 10.0
        state.asked("premium", "recent", 100.0 + FORGET_S)
        state.forget_idle(102.0 + FORGET_S)
        assert sorted(t for _, t in state.seen) == ["holding", "recent", "waiting"]
        assert sorted(state.overlaps) == sorted(state.arrived_at) == ["holding", "recent", "waiting"]
        assert "gone" not in state.hold_s and "gone" not in state.gaps and "recent" in state.hold_s
        assert queue.virtual == {"ahead": 12.0}, "caught up with and not queued: push starts them at the class's time"
        state.forget_idle(101.0 + FORGET_S)  # nothing is idle long enough: nothing more goes
        assert sorted(state.overlaps) == ["holding", "recent", "waiting"]
    asyncio.run(main())
