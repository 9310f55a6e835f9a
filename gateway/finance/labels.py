"""What finance calls a key: the name it was given at creation with its id beside it, the cache's own audit key
said to be that, and each key's own budget for the burn-down.

The ledger records a request's key as its id (``key-`` and twelve hex digits of its hash: gateway.keys.model.key_id),
never its name. ``Keys`` is the runtime keys' names and budgets as the key service holds them (read on the event
loop, handed to the report thread as plain values); a policy file's key has no name, and is said to be one. The
cache audit's re-asks are metered under the id ``AUDIT_KEY`` (gateway.batches.audit.KEY_ID): a tenant's bill shows
that line as the cache checking its own hits, which the tenant's traffic caused, not a key anyone holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.finance import words

AUDIT_KEY = "cache-audit"  # gateway.batches.audit.KEY_ID (tests/process/test_finance_terms.py keeps them equal)
AUDIT_NAME = "Cache audit"
AUDIT_WHY = ("the response cache re-asking a sample of its hits at temperature 0 to check them, as batch work; "
             "metered to the tenant whose hits were checked")


@dataclass(frozen=True, slots=True)
class Key:
    """A runtime key as finance names it: its id, tenant, name (may be empty), status and own budget."""

    id: str
    tenant: str
    name: str
    status: str
    budget_period: str | None = None
    budget_usd: float | None = None


Keys = Mapping[str, Key]


def keys_of(records: Iterable[Any], now: float) -> dict[str, Key]:
    """The key service's records (gateway.keys.model.KeyRecord) as plain values, by id."""
    out = {}
    for r in records:
        budget = r.budget
        out[r.id] = Key(r.id, r.tenant, r.name, r.status(now), budget.period if budget else None,
                        budget.limit_usd if budget else None)
    return out


def name_of(key_id: str | None, keys: Keys) -> str:
    """A key as a table shows it, in the language spoken: "name (key-…)", the audit key as what it is, a policy
    file's key as one."""
    if key_id is None:
        return words.say("(no key)")
    if key_id == AUDIT_KEY:
        return f"{words.say(AUDIT_NAME)} ({AUDIT_KEY})"
    key = keys.get(key_id)
    if key is None:
        return f"{words.say('(a key of the policy file)')} {key_id}"
    return f"{key.name} ({key_id})" if key.name else f"{words.say('(unnamed)')} {key_id}"


def budgeted(keys: Keys, tenant: str | None) -> list[Key]:
    """The keys with a budget of their own that still count (not revoked), of ``tenant`` or of every tenant."""
    return sorted((k for k in keys.values() if k.budget_usd is not None and k.status != "revoked"
                   and (tenant is None or k.tenant == tenant)), key=lambda k: (k.tenant, k.name, k.id))
