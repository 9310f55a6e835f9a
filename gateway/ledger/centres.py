"""Cost centres on a statement: each tenant's largest, and the rest as one line.

A statement has a line per tenant and cost centre (a record's ``tags``), and a ``user`` tag makes one per end
user: 20,000 lines in an ordinary month, most of them a few cents. So a statement shows each tenant's ``TOP``
cost centres by list-price spend (then by requests, then by the tags as text in the database's collation: one
ranking, counted in the database) and sums the rest of that tenant's into one line, ``OTHER``. Untagged records
keep their own line, as before. No figure is lost: a tenant's lines, its other line included, sum to its total,
and the GPU cost of the folded cost centres goes to the same other line (``fold`` gives the GPU report's records
the tags the ledger's sums get).

``Centres`` is the ledger as a statement reads it (gateway.ledger.closes takes it for the store): sums grouped
by tenant and tag come back folded, read from one cursor a chunk at a time, so no more than the folded lines and
one chunk are ever held; every other call is the store's own. The ranking is read once per ``Centres``, for the
one month it was made for: make one per statement. Everything here blocks (store calls): run it on a thread.
Why the bound: docs/decisions/009-finance-reads-off-the-loop.md.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from gateway.ledger.stores import LedgerStore

TOP = 200  # cost centres per tenant on a statement, before the rest are summed into OTHER
OTHER = "(other cost centres)"  # no tag set reads so: real ones are key=value pairs
SUMMED = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "cache_hits",
          "cache_saved_tokens", "errors")


class Centres:
    """``store`` with its sums by tenant and tag over [start, end) folded to each tenant's ``top`` cost centres
    and one OTHER line (a LedgerStore: it passes every other call through)."""

    def __init__(self, store: LedgerStore, start: str, end: str, top: int = TOP) -> None:
        self.store = store
        self.start, self.end, self.top = start, end, top
        self._kept: dict[str, frozenset[str]] | None = None

    def kept(self) -> dict[str, frozenset[str]]:
        """Each tenant's cost centres that keep a line of their own (read from the store on the first call)."""
        if self._kept is None:
            kept: dict[str, set[str]] = {}
            for row in self.store.top_tags(self.start, self.end, self.top):
                kept.setdefault(row["tenant"], set()).add(row["tags"])
            self._kept = {tenant: frozenset(tags) for tenant, tags in kept.items()}
        return self._kept

    def tag_of(self, tenant: str, tags: str | None) -> str | None:
        """The line a record of ``tenant`` with ``tags`` is counted in."""
        if tags is None or tags in self.kept().get(tenant, ()):
            return tags
        return OTHER

    def fold(self, record: dict[str, Any]) -> dict[str, Any]:
        """A record (of the GPU report's) with its tags as the statement counts them (changed in place)."""
        record["tags"] = self.tag_of(record["tenant"], record["tags"])
        return record

    def totals(self, start: str, end: str, group_by: Sequence[str], tenant: str | None,
               tag: str | None = None) -> list[dict[str, Any]]:
        """The store's sums; grouped by tenant and tag over this month, folded (in the order of the grouped
        values, an absent one first)."""
        if "tag" not in group_by or "tenant" not in group_by or (start, end) != (self.start, self.end):
            return self.store.totals(start, end, group_by, tenant, tag)
        keys = ["key_id" if g == "key" else g for g in group_by]
        folded: dict[tuple[Any, ...], dict[str, Any]] = {}
        for rows in self.store.stream_totals(start, end, group_by, tenant, tag):
            for row in rows:
                row["tag"] = self.tag_of(row["tenant"], row["tag"])
                key = tuple(row[k] for k in keys)
                into = folded.get(key)
                if into is None:
                    folded[key] = row
                else:
                    for name in SUMMED:
                        into[name] = (into[name] or 0) + (row[name] or 0)
        return [folded[key] for key in sorted(folded, key=_order)]

    # the store's own, unchanged

    def insert(self, records: Sequence[dict[str, Any]]) -> None:
        self.store.insert(records)

    def records(self, start: str, end: str, tenant: str | None, after: tuple[str, str] | None, limit: int,
                tag: str | None = None, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
        return self.store.records(start, end, tenant, after, limit, tag, columns)

    def stream_totals(self, start: str, end: str, group_by: Sequence[str], tenant: str | None,
                      tag: str | None = None, chunk: int = 2000) -> Generator[list[dict[str, Any]], None, None]:
        return self.store.stream_totals(start, end, group_by, tenant, tag, chunk)

    def top_tags(self, start: str, end: str, top: int) -> list[dict[str, Any]]:
        return self.store.top_tags(start, end, top)

    def tokens_percentile(self, start: str, end: str, q: float, tenant: str | None = None) -> int | None:
        return self.store.tokens_percentile(start, end, q, tenant)

    def extend_presence(self, spans: Sequence[dict[str, Any]]) -> None:
        self.store.extend_presence(spans)

    def presence(self, start: str, end: str) -> list[dict[str, Any]]:
        return self.store.presence(start, end)

    def add_close(self, close: dict[str, str]) -> None:
        self.store.add_close(close)

    def closes(self) -> list[dict[str, Any]]:
        return self.store.closes()

    def close(self) -> None:
        self.store.close()


def _order(key: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple("" if k is None else str(k) for k in key)
