"""What the cache holds in this process, in bytes per tenant and in total, in least-recently-used order.

An entry count bounds nothing: one embeddings answer is a few hundred bytes or tens of megabytes. So each
structure that keeps answers or vectors in memory counts the bytes it holds and evicts the tenant's least
recently used first while the tenant is over its share (one tenant never evicts another's entries for
its own), then the process's least recently used while the total is over.
"""

from __future__ import annotations

from collections import OrderedDict


class Footprint:
    """Sizes by key, in recency order per tenant and overall; ``add`` says what to evict to stay within bounds."""

    def __init__(self) -> None:
        self.total = 0
        self._all: OrderedDict[str, tuple[str, int]] = OrderedDict()  # key -> (tenant, bytes)
        self._tenants: dict[str, OrderedDict[str, None]] = {}
        self._tenant_bytes: dict[str, int] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._all

    def __len__(self) -> int:
        return len(self._all)

    def tenant_bytes(self, tenant: str) -> int:
        return self._tenant_bytes.get(tenant, 0)

    def tenant_entries(self, tenant: str) -> int:
        return len(self._tenants.get(tenant, ()))

    def add(self, key: str, tenant: str, nbytes: int, tenant_max: int, total_max: int,
            tenant_entries_max: int | None = None) -> list[str]:
        """Count ``key`` (again, if known) as the most recently used; returns the keys evicted to make room,
        which include ``key`` itself when it alone is over a bound."""
        self.remove(key)
        self._all[key] = (tenant, nbytes)
        self._tenants.setdefault(tenant, OrderedDict())[key] = None
        self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + nbytes
        self.total += nbytes
        evicted = []
        lru = self._tenants[tenant]
        while lru and (self._tenant_bytes[tenant] > tenant_max
                       or (tenant_entries_max is not None and len(lru) > tenant_entries_max)):
            victim = next(iter(lru))
            self.remove(victim)
            evicted.append(victim)
        while self._all and self.total > total_max:
            victim = next(iter(self._all))
            self.remove(victim)
            evicted.append(victim)
        return evicted

    def touch(self, key: str) -> None:
        found = self._all.get(key)
        if found is not None:
            self._all.move_to_end(key)
            self._tenants[found[0]].move_to_end(key)

    def remove(self, key: str) -> bool:
        found = self._all.pop(key, None)
        if found is None:
            return False
        tenant, nbytes = found
        lru = self._tenants[tenant]
        del lru[key]
        self.total -= nbytes
        if lru:
            self._tenant_bytes[tenant] -= nbytes
        else:
            del self._tenants[tenant], self._tenant_bytes[tenant]
        return True
