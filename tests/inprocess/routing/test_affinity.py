"""Prefix-cache affinity in-process: the same prefix goes where it went, within a load bound; a new prefix
and a conversation go where they hash, the same in every process."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from gateway.fleet.worker import Worker
from gateway.routing.affinity import Affinity, of_request
from gateway.routing.candidates import Candidates, load_bound
from gateway.routing.deciders import Route
from gateway.routing.prefixes import PrefixIndex
from gateway.routing.profiles import decide, prefix_deciders
from tests.fakes import live_worker

SYSTEM = "You are a careful assistant for the billing team. " * 20  # ~1 KB: 16 blocks


def choose(workers: Sequence[Worker], available: Collection[Worker], affinity: Affinity, index: PrefixIndex,
           room: Collection[Worker] = ()) -> Route:
    """The prefix profile's route among ``available``, and the index told it was sent there (as dispatch does)."""
    route = decide(prefix_deciders(index), Candidates(workers, available, room), affinity)
    index.taken(affinity, route.worker)
    return route


def chat(question: str, system: str = SYSTEM, user: str | None = None) -> dict[str, object]:
    body: dict[str, object] = {"model": "m", "messages": [{"role": "system", "content": system},
                                                         {"role": "user", "content": question}]}
    if user:
        body["user"] = user
    return body


def test_a_prompt_is_named_by_its_prefix() -> None:
    one, two = of_request(chat("What is a refund?")), of_request(chat("How do I pay?"))
    assert one is not None and two is not None
    shared = next(i for i, (a, b) in enumerate(zip(one.blocks, two.blocks, strict=False)) if a != b)
    assert shared >= 15, "the system prompt's blocks are the same, whatever follows"
    other = of_request(chat("What is a refund?", system="Another tenant's prompt. " * 40))
    assert other is not None and other.blocks[0] != one.blocks[0]
    assert of_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]}) is None, "nothing to go by"
    assert of_request({"model": "m", "prompt": "x" * 200}).blocks  # type: ignore[union-attr]


def test_the_same_prefix_goes_where_it_went_until_that_worker_is_too_busy() -> None:
    workers = [live_worker(f"http://w{i}") for i in range(4)]
    index = PrefixIndex()
    first = choose(workers, workers, of_request(chat("q1")), index)  # type: ignore[arg-type]
    assert first is not None and first.how == "hash"
    again = choose(workers, workers, of_request(chat("q2")), index)  # type: ignore[arg-type]
    assert again is not None and (again.worker, again.how) == (first.worker, "prefix")
    assert again.matched >= 15 and again.describe().startswith("prefix ")
    first.worker.inflight = 10  # past the bound over the mean (2.5)
    assert load_bound(2.5) < 10
    spilled = choose(workers, workers, of_request(chat("q3")), index)  # type: ignore[arg-type]
    assert spilled is not None and spilled.worker is not first.worker and spilled.how == "load"
    down = [w for w in workers if w is not spilled.worker]
    back = choose(workers, down, of_request(chat("q4")), index)  # type: ignore[arg-type]
    assert back is not None and back.worker in down


def test_a_cached_prefix_may_wait_for_its_worker_but_a_new_one_goes_where_there_is_room() -> None:
    workers = [live_worker(f"http://w{i}") for i in range(2)]
    index = PrefixIndex()
    home = choose(workers, workers, of_request(chat("q1")), index)  # type: ignore[arg-type]
    assert home is not None
    other = next(w for w in workers if w is not home.worker)
    home.worker.inflight, other.inflight = 2, 1  # the home is at its limit; the other has a slot free
    cached = choose(workers, workers, of_request(chat("q2")), index, room={other})  # type: ignore[arg-type]
    assert cached is not None and cached.worker is home.worker and cached.how == "prefix", \
        "the prefill its cache saves is worth a short wait there"
    for t in range(8):  # prompts nobody holds: whichever worker they hash to, they go to the one with room
        fresh = choose(workers, workers, of_request(chat("q", system=f"tenant {t} " * 30)), PrefixIndex(),
                       room={other})  # type: ignore[arg-type]
        assert fresh is not None and fresh.worker is other
    anywhere = choose(workers, workers, of_request(chat("q", system="t " * 90)), PrefixIndex(), room=set())  # type: ignore
    assert anywhere is not None, "no room anywhere: any available worker (premium past the limit)"


def test_a_new_prefix_and_a_conversation_hash_alike_in_every_process() -> None:
    workers = [live_worker(f"http://w{i}") for i in range(4)]
    homes = {choose(workers, workers, of_request(chat("q", system=f"tenant {t} " * 30)),  # type: ignore[arg-type]
                    PrefixIndex()).worker.url for t in range(40)}  # type: ignore[union-attr]
    assert len(homes) == 4, "new prefixes spread over the pool"
    a = choose(workers, workers, of_request(chat("hi", system="s", user="conv-7")), PrefixIndex())  # type: ignore
    b = choose(list(reversed(workers)), workers, of_request(chat("more", system="s", user="conv-7")),  # type: ignore
               PrefixIndex())
    assert a is not None and b is not None and a.worker is b.worker and a.how == "session"


def test_the_load_bound_leaves_room_for_the_swing_of_small_counts() -> None:
    """A quarter above the mean where counts are large; at a few in flight, the count's own Poisson swing
    (2.5 standard deviations), so that a burst of one does not move a prefix off the worker caching it."""
    assert load_bound(400) == 400 * 1.25 + 1
    assert load_bound(4) == 4 + 2.5 * 2 + 1 and load_bound(4) > 4 * 2
    assert load_bound(0) == 1


def test_the_index_is_bounded_and_forgets_a_worker() -> None:
    index = PrefixIndex(size=10)
    index.remember(list(range(8)), "http://a")
    index.remember(list(range(100, 108)), "http://b")
    assert len(index) == 10 and index.longest([100, 101, 102]) == ("http://b", 3)
    assert index.longest([0, 1]) == (None, 0), "the oldest went first"
    index.forget("http://b")
    assert index.longest([100]) == (None, 0)
    assert "http://b" not in index.footprint


def test_the_footprint_follows_the_index() -> None:
    """Each worker's footprint is the number of remembered blocks it holds: moved, evicted and forgotten."""
    index = PrefixIndex(size=10)
    index.remember([1, 2, 3], "http://a")
    index.remember([1, 2, 4, 5], "http://b")  # 1 and 2 move to b
    assert (index.footprint["http://a"], index.footprint["http://b"]) == (1, 4)
    index.remember(list(range(10, 18)), "http://a")  # 13 blocks in a 10-block index: the three oldest go
    assert sum(index.footprint.values()) == len(index) == 10
    assert (index.footprint["http://a"], index.footprint["http://b"]) == (8, 2)


def test_new_prefixes_fill_the_pool_evenly() -> None:
    """Four tenants' system prompts on two workers: two each, in every order of arrival, where hashing alone
    put three or four of them on one worker (and they evicted each other there) for most sets of prompts."""
    import itertools
    import random

    rng = random.Random(5)
    uneven_by_hash = 0
    for trial in range(40):
        workers = [live_worker(f"http://w{i}") for i in range(2)]
        systems = [f"tenant {trial}-{t}: " + " ".join(rng.choice("abcdefgh") * 3 for _ in range(100))
                   for t in range(4)]
        hashed = [choose(workers, workers, of_request(chat("q", system=s)), PrefixIndex()) for s in systems]  # type: ignore[arg-type]
        uneven_by_hash += max(sum(r.worker is w for r in hashed) for w in workers) > 2  # type: ignore[union-attr]
        for order in itertools.islice(itertools.permutations(systems), 0, 24, 5):
            index = PrefixIndex()
            for system in order:
                choose(workers, workers, of_request(chat("q", system=system)), index)  # type: ignore[arg-type]
            homes = [index.longest(of_request(chat("other", system=s)).blocks)[0] for s in systems]  # type: ignore[union-attr]
            assert sorted(homes.count(w.url) for w in workers) == [2, 2], (trial, homes)
    assert uneven_by_hash >= 10, "the positive control: hashing alone is often uneven"


def test_the_same_prompt_under_two_salts_is_two_prefixes() -> None:
    """The engine keeps a salted prompt's blocks apart from the same prompt's under another salt, so the index
    names them apart too: one tenant's prefix never routes another's prompt to where it is not cached."""
    plain, salted = of_request(chat("q")), of_request({**chat("q"), "cache_salt": "tenant-a"})
    again, other = of_request({**chat("q2"), "cache_salt": "tenant-a"}), of_request({**chat("q"), "cache_salt": "b"})
    assert plain is not None and salted is not None and again is not None and other is not None
    assert len(salted.blocks) == len(plain.blocks)
    assert not set(salted.blocks) & set(plain.blocks) and not set(salted.blocks) & set(other.blocks)
    assert salted.blocks[:15] == again.blocks[:15], "one salt: its system prompt is still one prefix"
    index = PrefixIndex()
    index.remember(salted.blocks, "http://a")
    assert index.longest(again.blocks) == ("http://a", 15)
    assert index.longest(other.blocks) == (None, 0) and index.longest(plain.blocks) == (None, 0)
