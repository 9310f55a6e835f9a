"""A runtime key's record, what an admin asks for when making one, and the tenant view a key narrows.

A key belongs to one tenant and may narrow it, never widen it: its own budget, rate limit and model list are
enforced beside the tenant's (both must pass), and its models are those of its list the tenant may use, so a
policy that later narrows the tenant narrows its keys too. A key with nothing of its own is its tenant's view.

A key and the keys rotated from it are one lineage: its own budget and rate limit are counted under the
lineage's first key (its scope in ``TenantView.budget_scopes`` and ``rate_scopes``: "#" and that key's id), so
a rotation hands the successor what its predecessors spent and sent this period, never a fresh allowance.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import unicodedata
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gateway.policy.loader import PolicySnapshot, TenantView
from gateway.policy.schema import Budget, Name, RateLimit

KEY_PREFIX = "tg-"
MAX_GRACE_S = 30 * 86400
DEFAULT_GRACE_S = 86400.0
# What a label for people may not hold: C0 and C1 controls and DEL, the bidirectional marks, embeddings,
# overrides and isolates, and line and paragraph separators. Each can hide, reorder or break what a terminal, a
# log line or a page shows (a name ending in U+202E reads backwards; one holding ESC or CSI drives the terminal).
UNSAFE_TEXT = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
LABEL_CHARS = 128  # of a label people read in the console, a terminal or the audit log: a key's name, a person's


def unsafe_character(text: str) -> str | None:
    """Why ``text`` may not be stored as a label for people (see ``UNSAFE_TEXT``), naming its first such character
    and where it is; None when it may."""
    found = UNSAFE_TEXT.search(text)
    if found is None:
        return None
    char = found.group()
    name = unicodedata.name(char, "a control character")
    return (f"holds U+{ord(char):04X} ({name}) at character {found.start() + 1}: control characters, bidirectional "
            "marks, overrides and isolates, and line or paragraph separators are refused (they can hide or reorder "
            "what a terminal or a page shows)")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_id(digest: str) -> str:
    """A short id of a key's hash (its first 12 hex digits): the ledger's key_id, enough to tell a tenant's keys
    apart, and not the key."""
    return "key-" + digest[:12]


def iso(moment: float | None) -> str | None:
    return None if moment is None else datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class KeyedTenant(TenantView):
    """A tenant seen through one of its runtime keys: ``models`` already narrowed; the key's own budget and rate
    limit apply beside the tenant's (gateway.spend, gateway.ratelimit)."""

    key_id: str = ""
    key_budget: Budget | None = None
    key_rate_limit: RateLimit | None = None
    lineage: tuple[str, ...] = ()  # this key and those it was rotated from, oldest first


def lineage_of(tenant: TenantView) -> tuple[str, ...]:
    """The key ids whose ledger records count against the request's key's own budget."""
    if isinstance(tenant, KeyedTenant):
        return tenant.lineage or (tenant.key_id,)
    return ()


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One row of ``api_keys``, read: never the key, only its hash (``digest``, sha256 hex as the policy's)."""

    id: str
    digest: str
    tenant: str
    name: str
    created_at: float
    created_by: str
    expires_at: float | None
    revoked_at: float | None
    revoked_by: str | None
    rotated_from: str | None
    rotated_to: str | None
    budget: Budget | None
    rate_limit: RateLimit | None
    models: tuple[str, ...] | None
    version: int

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> KeyRecord:
        limits = orjson.loads(row["limits"])
        return cls(id=row["id"], digest=row["digest"], tenant=row["tenant"], name=row["name"],
                   created_at=float(row["created_at"]), created_by=row["created_by"],
                   expires_at=_float(row["expires_at"]), revoked_at=_float(row["revoked_at"]),
                   revoked_by=row["revoked_by"], rotated_from=row["rotated_from"], rotated_to=row["rotated_to"],
                   budget=Budget.model_validate(limits["budget"]) if limits.get("budget") else None,
                   rate_limit=RateLimit.model_validate(limits["rate_limit"]) if limits.get("rate_limit") else None,
                   models=tuple(limits["models"]) if limits.get("models") is not None else None,
                   version=int(row["version"]))

    def status(self, now: float) -> str:
        """revoked | expired | rotated (its successor made, valid until its grace ends) | active."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "rotated" if self.rotated_to else "active"

    def valid(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)

    def public(self, now: float) -> dict[str, Any]:
        """What the admin API shows: everything but the hash."""
        return {"id": self.id, "object": "api_key", "tenant": self.tenant, "name": self.name,
                "status": self.status(now), "created_at": iso(self.created_at), "created_by": self.created_by,
                "expires_at": iso(self.expires_at), "revoked_at": iso(self.revoked_at), "revoked_by": self.revoked_by,
                "rotated_from": self.rotated_from, "rotated_to": self.rotated_to, **self.limits()}

    def limits(self) -> dict[str, Any]:
        return {"budget": self.budget.model_dump(mode="json") if self.budget else None,
                "rate_limit": self.rate_limit.model_dump(mode="json", exclude_none=True) if self.rate_limit else None,
                "models": list(self.models) if self.models is not None else None}


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def narrowed(base: TenantView, record: KeyRecord, lineage: tuple[str, ...] = ()) -> TenantView:
    """The tenant as this key may use it (the tenant's own view when the key narrows nothing); ``lineage``: the
    key's id and those it was rotated from, oldest first (its own limits are counted under the first)."""
    if record.budget is None and record.rate_limit is None and record.models is None:
        return base
    models = base.models
    if record.models is not None:
        models = frozenset(record.models) if models is None else models & frozenset(record.models)
    values = {f.name: getattr(base, f.name) for f in fields(TenantView)}
    lineage = lineage or (record.id,)
    meter = "#" + lineage[0]  # a key's scope: a name no tenant can have
    budgets = base.budget_scopes + (((meter, record.budget),) if record.budget is not None else ())
    rates = base.rate_scopes + (((meter, record.rate_limit),) if record.rate_limit is not None else ())
    return KeyedTenant(**{**values, "models": models, "budget_scopes": budgets, "rate_scopes": rates},
                       key_id=record.id, key_budget=record.budget, key_rate_limit=record.rate_limit, lineage=lineage)


def _sane(moment: datetime) -> datetime:
    """A key's expiry within years any clock handles (a zone offset at year 9999 overflows a timestamp)."""
    if not 1971 <= moment.year <= 8999:
        raise ValueError("must be a moment between the years 1971 and 8999")
    return moment


Moment = Annotated[datetime, AfterValidator(_sane)]


class KeySpec(BaseModel):
    """A key asked for (POST /admin/keys): its tenant and label, when it expires, and what it narrows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: Name
    name: str = Field("", max_length=LABEL_CHARS, description="a label for people (no control, bidi or separator "
                      "characters: spec_problems)")
    expires_at: Moment | None = Field(None, description="ISO 8601 (UTC without an offset) or a Unix time")
    expires_in_s: float | None = Field(None, gt=0, le=10 * 365 * 86400)
    budget: Budget | None = None
    rate_limit: RateLimit | None = None
    models: list[Name] | None = Field(None, min_length=1, max_length=1000)

    def expiry(self, now: float) -> float | None:
        if self.expires_in_s is not None:
            return now + self.expires_in_s
        return timestamp(self.expires_at) if self.expires_at is not None else None


def timestamp(moment: datetime) -> float:
    """A moment as a Unix time (a naive one is UTC)."""
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def spec_problems(snapshot: PolicySnapshot, spec: KeySpec, now: float) -> list[tuple[str, str]]:
    """Why the policy's tenant cannot have this key, each with its parameter: a name holding what may not be shown
    (``unsafe_character``), and a key narrows, never widens."""
    unsafe = unsafe_character(spec.name)
    named = [("name", unsafe)] if unsafe is not None else []
    tenant = snapshot.tenants.get(spec.tenant)
    if tenant is None:
        return [*named, ("tenant", f"no tenant '{spec.tenant}' in the policy")]
    problems: list[tuple[str, str]] = named
    if spec.expires_at is not None and spec.expires_in_s is not None:
        problems.append(("expires_at", "give expires_at or expires_in_s, not both"))
    expiry = spec.expiry(now)
    if expiry is not None and expiry <= now:
        problems.append(("expires_at", "the key would have expired already"))
    for i, model in enumerate(spec.models or ()):
        if model not in snapshot.policy.models:
            problems.append((f"models.{i}", f"model '{model}' is not defined in the policy"))
        elif not tenant.may_use(model):
            problems.append((f"models.{i}", f"tenant '{tenant.name}' may not use model '{model}'"))
    ceiling = tenant.budget
    if spec.budget is not None and ceiling is not None and spec.budget.limit_usd > ceiling.limit_usd and \
            (spec.budget.period == ceiling.period or spec.budget.period == "day"):
        problems.append(("budget.limit_usd", f"over the tenant's budget of ${ceiling.limit_usd:g} per "
                                             f"{ceiling.period}: a key can narrow its tenant, never widen it"))
    if spec.rate_limit is not None and tenant.rate_limit is not None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            own, theirs = getattr(spec.rate_limit, name), getattr(tenant.rate_limit, name)
            if own is not None and theirs is not None and own > theirs:
                problems.append((f"rate_limit.{name}", f"over the tenant's {theirs} {name.replace('_', ' ')}: a "
                                                      "key can narrow its tenant, never widen it"))
    return problems
