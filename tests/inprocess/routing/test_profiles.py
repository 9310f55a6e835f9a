"""A pool's router per ``pools.<pool>.routing``: each profile picks as the dispatcher's if-chain did (prefix
deciders within the load bound, least load with room, in turn), and names the route Server-Timing shows."""

from __future__ import annotations

import time
import typing
from collections import Counter

from gateway.fleet.worker import Worker
from gateway.policy.schema import Pool
from gateway.routing.affinity import Affinity, of_request
from gateway.routing.deciders import rendezvous
from gateway.routing.prefixes import PrefixIndex
from gateway.routing.profiles import PROFILES, LoadRouter, PrefixRouter, RoundRobinRouter, router_for
from tests.fakes import live_worker

SYSTEM = "You answer questions about the quarterly billing report, in short plain sentences. " * 12


def pool(n: int) -> list[Worker]:
    return [live_worker(f"http://w{i}") for i in range(n)]


def prompt(question: str, system: str = SYSTEM, user: str | None = None) -> Affinity:
    body: dict[str, object] = {"messages": [{"role": "system", "content": system},
                                            {"role": "user", "content": question}]}
    if user:
        body["user"] = user
    found = of_request(body)
    assert found is not None
    return found


def test_every_routing_the_policy_accepts_has_a_profile_built_once() -> None:
    accepted = set(typing.get_args(Pool.model_fields["routing"].annotation))
    assert set(PROFILES) == accepted
    workers, index = pool(2), PrefixIndex()
    kinds = {name: type(router_for(name, workers)) for name in accepted}
    assert kinds == {"prefix": PrefixRouter, "load": LoadRouter, "round_robin": RoundRobinRouter}
    kept = router_for("load", workers, index)
    assert kept.index is index and kept.workers is workers, "a replaced pool keeps its index and its own list"
    assert router_for("prefix", workers).index is not index


def test_prefix_sends_a_new_prompt_where_it_hashes_and_then_where_it_was_taken() -> None:
    workers = pool(4)
    router = router_for("prefix", workers)
    first = prompt("What was billed in May?")
    home = rendezvous(first.blocks[0].to_bytes(4, "little"), workers)
    assert router.first(first, ()) == (home, "hash")
    assert router.first(prompt("And in June?"), ()) == (home, "hash"), "not taken yet: still a new prefix"
    assert home is not None
    router.taken(first, home)
    again = prompt("And in June?")
    worker, route = router.first(again, ())
    shared = router.index.longest(again.blocks)[1]
    assert worker is home and route == f"prefix {shared}/{len(again.blocks)}" and shared >= 15


def test_prefix_holds_to_the_load_bound_and_prefers_room_for_what_nobody_holds() -> None:
    workers = pool(2)
    router = router_for("prefix", workers)
    held = prompt("q1")
    router.taken(held, workers[0])
    workers[0].inflight = 20  # past the bound over the mean of 10 (18.9)
    assert router.first(prompt("q2"), ()) == (workers[1], "load")
    workers[0].inflight = 2
    assert router.first(prompt("q3"), {workers[1]})[0] is workers[0], "a cached prefix may wait for its worker"
    for t in range(8):  # prompts nobody holds go to the one with room, wherever they hash
        assert router.first(prompt("q", system=f"tenant {t} " * 30), {workers[1]})[0] is workers[1]


def test_prefix_pins_a_conversation_by_its_name_over_the_whole_pool() -> None:
    workers = pool(4)
    a, b = router_for("prefix", workers), router_for("prefix", list(reversed(workers)))
    named = prompt("hi", system="s", user="conv-7")
    assert a.first(named, ())[1] == "session" and a.first(named, ())[0] is b.first(named, ())[0]


def test_prefix_with_nothing_to_go_by_or_one_worker_routes_by_load() -> None:
    workers = pool(3)
    workers[0].inflight, workers[1].inflight = 2, 1
    router = router_for("prefix", workers)
    assert router.affinity({"messages": [{"role": "user", "content": "hi"}]}, None) is None
    assert router.first(None, ()) == (workers[2], "load")
    alone = router_for("prefix", pool(1))
    assert alone.affinity({"prompt": "x" * 200}, "conv") is None, "one worker: nothing to choose, nothing to hash"
    assert alone.first(prompt("q"), ()) == (alone.workers[0], None)


def test_prefix_with_no_worker_available_routes_nowhere() -> None:
    workers = pool(2)
    for w in workers:
        w.observed.healthy = False
    assert router_for("prefix", workers).first(prompt("q"), ()) == (None, None)


def test_load_goes_to_the_least_loaded_with_room_and_reads_no_prompt() -> None:
    workers = pool(3)
    workers[0].inflight, workers[1].inflight, workers[2].inflight = 0, 2, 1
    router = router_for("load", workers)
    assert router.first(None, ()) == (workers[0], "load")
    assert router.first(None, {workers[1], workers[2]}) == (workers[2], "load"), "the scheduler's view first"
    assert router.affinity({"prompt": "x" * 200}, "conv") is None
    router.taken(prompt("q"), workers[0])
    assert len(router.index) == 0, "only the prefix profile learns where prompts went"
    assert router_for("load", workers[:1]).first(None, ()) == (workers[0], None)


def test_round_robin_goes_in_turn_whatever_the_load() -> None:
    workers = pool(3)
    workers[0].inflight = 50
    workers[1].observed.cooldown_until = time.monotonic() + 60
    router = router_for("round_robin", workers)
    turns = Counter(router.first(prompt("q"), {workers[2]}) for _ in range(40))
    assert set(turns) == {(workers[0], "round_robin"), (workers[2], "round_robin")}
    assert abs(turns[(workers[0], "round_robin")] - turns[(workers[2], "round_robin")]) <= 14


def test_a_retry_goes_to_the_least_loaded_of_the_others_in_every_profile() -> None:
    for name in PROFILES:
        workers = pool(3)
        workers[1].inflight, workers[2].inflight = 3, 1
        router = router_for(name, workers)
        assert router.retry({workers[0]}) == (workers[2], "load") and router.can_retry({workers[0]})
        assert router.retry(set(workers)) == (None, "load") and not router.can_retry(set(workers))
        assert router.pinned("http://w1") is workers[1] and router.pinned("http://elsewhere") is None
