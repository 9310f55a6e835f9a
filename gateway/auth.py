"""API keys -> tenants, and which role a credential holds. Keys are known only as SHA-256 hashes: the policy's,
and the runtime ones of gateway.keys (made through the admin API, checked here against that process's in-memory
map, never the database)."""

from __future__ import annotations

import hmac
import time

from gateway.errors import NotAuthenticated, NotPermitted
from gateway.keys.model import KEY_PREFIX, hash_key, iso, key_id, new_key
from gateway.keys.service import serving
from gateway.policy.loader import PolicySnapshot, TenantView

__all__ = ["KEY_PREFIX", "admin_actor", "authenticate", "bearer", "hash_key", "identify", "is_admin", "new_key",
           "role_of", "token_matches"]
ROLE_TOKENS = (("admin", "admin_token_sha256"), ("finance", "finance_token_sha256"),
               ("metrics", "metrics_token_sha256"))


def bearer(authorization: bytes | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def identify(authorization: bytes | None, snapshot: PolicySnapshot) -> tuple[TenantView, str]:
    """The key's tenant (as the key narrows it) and a short id of the key (gateway.keys.model.key_id)."""
    key = bearer(authorization)
    if key is None:
        raise NotAuthenticated("Missing API key: send 'Authorization: Bearer <key>'.", "missing_api_key")
    digest = hash_key(key)
    tenant = snapshot.tenants_by_key.get(digest) or _runtime_tenant(snapshot, digest)
    if tenant is None:
        raise NotAuthenticated("Incorrect API key provided.", "invalid_api_key")
    return tenant, key_id(digest)


def _runtime_tenant(snapshot: PolicySnapshot, digest: str) -> TenantView | None:
    keys = serving(snapshot)
    record = keys.find(digest) if keys is not None else None
    if keys is None or record is None:
        return None
    if record.revoked_at is not None:
        raise NotAuthenticated("This API key has been revoked.", "invalid_api_key")
    if record.expires_at is not None and record.expires_at <= time.time():
        raise NotAuthenticated(f"This API key expired at {iso(record.expires_at)}.", "invalid_api_key")
    return keys.view(snapshot, record)


def authenticate(authorization: bytes | None, snapshot: PolicySnapshot) -> TenantView:
    return identify(authorization, snapshot)[0]


def token_matches(authorization: bytes | None, expected: str | None) -> bool:
    """A bearer token checked against a 'sha256:<hex>' hash from the policy, in constant time."""
    token = bearer(authorization)
    if expected is None or token is None:
        return False
    return hmac.compare_digest("sha256:" + hash_key(token), expected)


def is_admin(authorization: bytes | None, snapshot: PolicySnapshot) -> bool:
    return token_matches(authorization, snapshot.policy.server.admin_token_sha256)


def role_of(authorization: bytes | None, snapshot: PolicySnapshot) -> str | None:
    """admin | finance | metrics | tenant for a credential this gateway knows now; None for any other."""
    server = snapshot.policy.server
    for role, field in ROLE_TOKENS:
        if token_matches(authorization, getattr(server, field)):
            return role
    try:
        identify(authorization, snapshot)
    except NotAuthenticated:
        return None
    return "tenant"


def admin_actor(authorization: bytes | None, snapshot: PolicySnapshot) -> str:
    """Who calls an admin-only route ("admin:" and the first hex digits of the admin token's hash, as the
    sign-in sessions name it): an unknown credential is 401, a known one of another role 403."""
    expected = snapshot.policy.server.admin_token_sha256
    if expected is None:
        raise NotPermitted("The admin API is disabled: set server.admin_token_sha256.", "admin_disabled")
    role = role_of(authorization, snapshot)
    if role == "admin":
        return "admin:" + expected.removeprefix("sha256:")[:12]
    if role is None:
        raise NotAuthenticated("A valid admin token is required.", "invalid_admin_token")
    held = "a tenant's API key" if role == "tenant" else f"the {role} token"
    raise NotPermitted(f"This route needs the admin token; the credential sent is {held}.", "permission_denied")
