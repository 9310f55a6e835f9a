"""Each decider alone: it names a worker within the load bound, or nothing (and the profile asks the next)."""

from __future__ import annotations

from gateway.routing.affinity import Affinity
from gateway.routing.candidates import Candidates
from gateway.routing.deciders import FirstBlockHash, PrefixMatch, SessionRendezvous, rendezvous, roomiest
from gateway.routing.prefixes import PrefixIndex
from tests.fakes import live_worker

PROMPT = Affinity(blocks=(7, 8, 9), session="conv-1")


def test_prefix_match_names_the_holder_within_the_bound_only() -> None:
    workers = [live_worker(f"http://w{i}") for i in range(2)]
    index = PrefixIndex()
    assert PrefixMatch(index).decide(Candidates(workers, workers, ()), PROMPT) is None, "nothing known"
    index.remember((7, 8), "http://w1")
    route = PrefixMatch(index).decide(Candidates(workers, workers, ()), PROMPT)
    assert route is not None and (route.worker, route.describe()) == (workers[1], "prefix 2/3")
    assert PrefixMatch(index).decide(Candidates(workers, [workers[0]], ()), PROMPT) is None, "not available"
    workers[1].inflight = 20
    assert PrefixMatch(index).decide(Candidates(workers, workers, ()), PROMPT) is None, "past the bound"


def test_a_session_hashes_over_the_whole_pool_even_when_its_home_is_down() -> None:
    workers = [live_worker(f"http://w{i}") for i in range(3)]
    home = rendezvous(b"conv-1", workers)
    route = SessionRendezvous().decide(Candidates(workers, workers, ()), PROMPT)
    assert route is not None and (route.worker, route.how) == (home, "session")
    others = [w for w in workers if w is not home]
    assert SessionRendezvous().decide(Candidates(workers, others, ()), PROMPT) is None, "it does not move"
    assert SessionRendezvous().decide(Candidates(workers, workers, ()), Affinity(blocks=(1,))) is None


def test_the_first_block_hash_is_for_prompts_nobody_holds_and_among_the_roomiest() -> None:
    workers = [live_worker(f"http://w{i}") for i in range(2)]
    index = PrefixIndex()
    route = FirstBlockHash(index).decide(Candidates(workers, workers, ()), PROMPT)
    assert route is not None and route.how == "hash"
    assert route.worker is rendezvous((7).to_bytes(4, "little"), workers)
    index.remember((7,), "http://elsewhere")
    assert FirstBlockHash(index).decide(Candidates(workers, workers, ()), PROMPT) is None, "some prefix is known"
    index = PrefixIndex()
    index.remember(range(100, 140), route.worker.url)  # the hash's home holds far more than the other
    assert roomiest(workers, index, 3) == [w for w in workers if w is not route.worker]
    moved = FirstBlockHash(index).decide(Candidates(workers, workers, ()), PROMPT)
    assert moved is not None and moved.worker is not route.worker
