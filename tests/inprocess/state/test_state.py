"""Shared state, read in this process: a reload cannot move it. (The live processes in Redis and their parts of
a worker's limit: tests/process/state/test_state.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from gateway.policy.loader import PolicyError, PolicyStore


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
