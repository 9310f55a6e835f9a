"""Shared state, read in this process: a reload cannot move it. (The live processes in Redis and their parts of
a worker's limit: tests/process/state/test_state.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gateway.policy.loader import PolicyError, PolicyStore
from gateway.state.replicas import Share


def test_a_reload_cannot_move_shared_state(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "allow_empty": True}))
    store = PolicyStore.from_file(path)
    moved = {"version": 1, "allow_empty": True, "state": {"redis_url": "redis://shared-state:6379/0"}}  # never dialled
    with pytest.raises(PolicyError, match="restart"):
        asyncio.run(store.apply_text(yaml.safe_dump(moved)))
    assert store.current.policy.state.redis_url is None and store.reloads_failed == 1
    asyncio.run(store.apply_text(yaml.safe_dump({"version": 1, "allow_empty": True, "cache": {"enabled": True}})))
    assert store.current.policy.cache.enabled, "other changes still apply live"


def _check_split(limit: int, of: int, split: type[Share] = Share) -> None:
    parts = [split(index, of).of_limit(limit) for index in range(of)]
    assert sum(parts) == (max(limit, of) if limit else 0)
    assert all(part >= 1 for part in parts) if limit else not any(parts)
    assert max(parts) - min(parts) <= 1, "even: no process is handed more than one above another"


@given(limit=st.integers(0, 300), of=st.integers(1, 40))
def test_every_process_gets_a_part_and_together_they_stay_within_the_limit(limit: int, of: int) -> None:
    """The split's two promises, for any limit and number of processes: no live process is left without a part
    of a worker that runs anything (it would queue there until its deadline while the worker idles), and the
    parts add up to the limit, or to one each when the processes outnumber it."""
    _check_split(limit, of)


def test_a_split_that_leaves_a_process_out_is_caught() -> None:
    """Positive control: the split as it was (the remainder to the lowest indexes, nothing for the rest) gives a
    second process nothing of a worker that runs one request."""
    class Exact(Share):
        def of_limit(self, limit: int) -> int:
            return limit // self.of + (1 if self.index < limit % self.of else 0)

    _check_split(5, 2, Exact)  # with more slots than processes the two agree
    with pytest.raises(AssertionError):
        _check_split(1, 2, Exact)
