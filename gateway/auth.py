"""API keys -> tenants. Keys live in the policy only as SHA-256 hashes."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from gateway.errors import NotAuthenticated
from gateway.policy.loader import PolicySnapshot, TenantView

KEY_PREFIX = "tg-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def bearer(authorization: bytes | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def identify(authorization: bytes | None, snapshot: PolicySnapshot) -> tuple[TenantView, str]:
    """The key's tenant and a short id of the key (the first 12 hex digits of its hash: enough to tell a
    tenant's keys apart in the ledger, and not the key)."""
    key = bearer(authorization)
    if key is None:
        raise NotAuthenticated("Missing API key: send 'Authorization: Bearer <key>'.", "missing_api_key")
    digest = hash_key(key)
    tenant = snapshot.tenants_by_key.get(digest)
    if tenant is None:
        raise NotAuthenticated("Incorrect API key provided.", "invalid_api_key")
    return tenant, "key-" + digest[:12]


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
