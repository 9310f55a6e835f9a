"""The gateway's own secrets, for values clients must not guess yet every gateway process must agree on: each
tenant's prefix-cache salt (``gateway.openai_api.cache_salt``, from ``GATEWAY_SECRET``), and the signature of the
finance page's sign-in cookies (``gateway.http.sessions``, a key of its own).

Never in the policy, which anyone who reads it could then use to name a tenant's salt to the engines. Kept in
Redis when replicas share state (the first process to start makes it), else in the data directory (so the
processes of one host, and a restarted one, agree), else made per process. A salt that changes costs only a
cold prefix cache, never an answer, so a Redis that is down at start leaves this host's key in use.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from gateway.state import SharedState

log = logging.getLogger("tollgate.secret")
KEY_BYTES = 32
KEPT_MAX = 65536  # derived values kept (a policy's tenants); past it the store starts afresh
FILE = "gateway.key"


class Secret:
    """A key every process of the gateway agrees on: ``file`` in the data directory, ``shared_name`` in Redis."""

    def __init__(self, file: str = FILE, shared_name: str = "gateway-key") -> None:
        self.file, self.shared_name = file, shared_name
        self._key = secrets.token_bytes(KEY_BYTES)
        self._kept: dict[tuple[bytes, bytes], bytes] = {}  # (purpose, message) -> value, for the few kept ones

    @property
    def key(self) -> bytes:
        return self._key

    def load(self, data_dir: Path | None) -> None:
        """This host's key: the data directory's, made there by the first process that needs it."""
        if data_dir is not None:
            self._key = _local_key(data_dir / self.file)
            self._kept.clear()

    async def share(self, state: SharedState | None) -> None:
        """With shared state: every replica takes the one key in Redis (the first to start makes it)."""
        if state is None or state.redis is None:
            return
        name = state.prefix + self.shared_name
        try:
            await state.redis.set(name, self._key, nx=True)
            shared = await state.redis.get(name)
        except state.errors as exc:
            log.error("%s not shared through Redis (%s): what it signs or derives holds on this host only",
                      self.shared_name, exc)
            return
        if isinstance(shared, bytes) and len(shared) == KEY_BYTES:
            self._key = shared
            self._kept.clear()

    def derive(self, purpose: bytes, message: bytes) -> bytes:
        """An HMAC of ``message`` for one ``purpose``: values derived for one use say nothing of another's."""
        return hmac.digest(self._key, purpose + b"\x00" + message, hashlib.sha256)

    def derive_kept(self, purpose: bytes, message: bytes) -> bytes:
        """``derive``, kept for the next call: for values asked for on every request whose messages are few (a
        tenant's salt: one per tenant of the policy; the HMAC was 2 us of every request)."""
        found = self._kept.get((purpose, message))
        if found is None:
            if len(self._kept) >= KEPT_MAX:
                self._kept.clear()
            found = self._kept[(purpose, message)] = self.derive(purpose, message)
        return found


def _local_key(path: Path) -> bytes:
    """The key in ``path``, or a new one put there whole: linked from a complete temporary file, so a process
    reading it never sees half a key, and of processes starting together one key wins."""
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = b""
    if len(key) == KEY_BYTES:
        return key
    fresh = secrets.token_bytes(KEY_BYTES)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(fresh)
        f.flush()
        os.fsync(f.fileno())
    try:
        if key:  # a damaged file (not a key): replaced, at the cost of a cold prefix cache
            os.replace(temporary, path)
        else:
            os.link(temporary, path)
        return fresh
    except FileExistsError:
        return _local_key(path)  # another process's, whole
    finally:
        temporary.unlink(missing_ok=True)


GATEWAY_SECRET = Secret()  # one per process, as the key is: loaded and shared by runtime.Gateway at start
