"""Footprint: bytes per tenant and in total, least recently used first, and one tenant never evicts another's
entries for its own."""

from __future__ import annotations

from gateway.cache.bounds import Footprint

BIG = 10**9


def test_a_tenant_over_its_share_evicts_its_own_oldest_not_anothers() -> None:
    held = Footprint()
    assert held.add("other-1", "other", 40, tenant_max=100, total_max=BIG) == []
    for i in range(3):
        assert held.add(f"a-{i}", "a", 30, tenant_max=100, total_max=BIG) == []
    assert held.add("a-3", "a", 30, tenant_max=100, total_max=BIG) == ["a-0"], "a's own oldest, not other's"
    assert "other-1" in held and held.tenant_bytes("a") == 90 and held.total == 130


def test_a_touch_makes_an_entry_the_last_to_go() -> None:
    held = Footprint()
    for i in range(3):
        held.add(f"k{i}", "a", 10, tenant_max=30, total_max=BIG)
    held.touch("k0")
    held.touch("never-added")  # unknown keys are ignored
    assert held.add("k3", "a", 10, tenant_max=30, total_max=BIG) == ["k1"]


def test_the_total_evicts_the_processs_oldest_whoever_holds_it() -> None:
    held = Footprint()
    held.add("b-old", "b", 50, tenant_max=BIG, total_max=100)
    held.add("a-1", "a", 40, tenant_max=BIG, total_max=100)
    assert held.add("a-2", "a", 40, tenant_max=BIG, total_max=100) == ["b-old"]
    assert held.tenant_bytes("b") == 0 and held.tenant_entries("b") == 0 and held.total == 80


def test_an_entry_over_a_bound_on_its_own_evicts_itself() -> None:
    held = Footprint()
    held.add("small", "a", 10, tenant_max=100, total_max=BIG)
    assert held.add("huge", "a", 500, tenant_max=100, total_max=BIG) == ["small", "huge"]
    assert len(held) == 0 and held.total == 0


def test_adding_a_key_again_counts_its_new_size_once() -> None:
    held = Footprint()
    held.add("k", "a", 60, tenant_max=100, total_max=BIG)
    assert held.add("k", "a", 70, tenant_max=100, total_max=BIG) == [], "the old 60 bytes are not counted twice"
    assert (held.total, held.tenant_bytes("a"), len(held)) == (70, 70, 1)


def test_the_entry_count_bounds_a_tenant_too() -> None:
    held = Footprint()
    for i in range(3):
        held.add(f"k{i}", "a", 1, tenant_max=BIG, total_max=BIG, tenant_entries_max=2)
    assert held.tenant_entries("a") == 2 and "k0" not in held
    assert held.remove("k1") and not held.remove("k1"), "a second remove finds nothing"
