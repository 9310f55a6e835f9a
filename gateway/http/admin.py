"""The admin API (/admin/*): the policy (read, redacted; apply; status), queues, cache purge, anomalies, scale,
and the audit log. Every route needs the admin token: an unknown credential is 401, a known one of another role
(a tenant's key, the finance or metrics token) 403 (the cost reports, which a finance token also reads, are in
gateway.http.reports; runtime keys in gateway.http.keys_api).

Every admin action that changes something (a policy applied or refused, a cache purge, a key operation, a month
closed or reopened) is written to the audit log (gateway.keys.store): who (the role and the first hex digits of
its token's hash), when, what, and from where: the peer's address, and behind a proxy listed in
``server.trusted_proxies`` (none by default: a header is anyone's word) the address it names in X-Forwarded-For
beside it. A policy change records each path with its old and new values, secrets redacted as GET /admin/policy
shows them: token hashes, key hashes (as key ids), the password of a DSN or URL, and of the webhook and the
tracing endpoint all but the scheme and host (``redact_endpoint``); an entry's details are bounded in bytes
(gateway.keys.store.bounded). ``GET /admin/audit`` answers pages of at most ``AUDIT_PAGE_BYTES``, newest first,
each naming the cursor of the next.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import logging
import re
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
import yaml
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.cache.store import StoreUnavailable
from gateway.errors import Conflict, InvalidRequest, NotFound, Unavailable
from gateway.finance.reports import shown_range
from gateway.http.asgi import read_body, request_headers
from gateway.http.guards import gateway_of, require_admin
from gateway.http.reports import time_range
from gateway.http.responses import json_response
from gateway.keys.model import key_id, unsafe_character
from gateway.keys.service import KeyService
from gateway.ledger import times
from gateway.policy.loader import (
    MAX_POLICY_BYTES,
    FileReload,
    PolicyChanged,
    PolicyError,
    PolicySnapshot,
    PolicyStore,
    load_yaml,
)
from gateway.policy.schema import Policy
from gateway.spend.alerts import public

log = logging.getLogger("tollgate.admin")
REDACTED = "<redacted>"
MAX_AUDITED_CHANGES = 200  # paths with their values in one policy change's entry (the total is always said)
MAX_AUDITED_VALUE = 1024  # bytes of JSON one old or new value may take there; larger ones are summarised
AUDIT_PAGE_BYTES = 1 << 20  # what one page of GET /admin/audit may take (entries are bounded far below it)
VIA = " via "  # an audit entry's client: "<the address a trusted proxy named> via <the peer>", or the peer alone
_SECRET_QUERY = re.compile(r"pass|secret|token|key|auth|sig", re.IGNORECASE)
_DSN_PASSWORD = re.compile(r"\b(password|sslpassword)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def client_address(request: Request) -> str | None:
    """Where an admin call came from, as its audit entry keeps it: the peer's address; or, when the peer is a
    proxy listed in ``server.trusted_proxies`` (none by default), the nearest address in X-Forwarded-For that is
    not one of them (each trusted hop vouches only for the one before it) followed by ``VIA`` and the peer, so
    the entry says both what was believed and who said it. A forwarded value that is not an address stops the
    walk."""
    peer = request.client.host[:64] if request.client else None
    if peer is None:
        return None
    trusted = gateway_of(request).store.current.policy.server.trusted_proxies
    current = peer
    if trusted and _within(peer, trusted):
        hops = [h.strip() for value in request.headers.getlist("x-forwarded-for") for h in value.split(",")]
        while hops and _within(current, trusted):
            hop = hops.pop()
            if not _address(hop):
                break
            current = hop
    return current if current == peer else f"{current}{VIA}{peer}"


def shown_client(client: str | None) -> dict[str, str | None]:
    """An audit entry's stored client as the log shows it: ``client`` (the caller, as believed) and ``peer`` (the
    address that connected; the client itself when no trusted proxy named another)."""
    if client is None:
        return {"client": None, "peer": None}
    believed, _, peer = client.partition(VIA)
    return {"client": believed, "peer": peer or believed}


def _address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _within(text: str, networks: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    return any(address in network for network in networks)


async def audited(request: Request, actor: str, action: str, target: str | None, details: dict[str, Any]) -> None:
    """Write an admin action that changed no key to the audit log; an entry the store cannot take goes to the
    log instead (the action is done: refusing its answer now would say it was not)."""
    client = client_address(request)
    try:
        await gateway_of(request).keys.record(actor, client, action, target, details)
    except Exception as exc:
        log.error("audit entry not stored (%s): %s", exc, orjson.dumps(
            {"actor": actor, "client": client, "action": action, "target": target, "details": details}).decode())


def redact_url(url: str | None, lone_user: bool = True) -> str | None:
    """A URL without the secrets it may carry: the password of its user (or with ``lone_user`` the user, when it
    stands alone: a token, in an HTTP URL), and query values whose names say they are secret."""
    if not url or "://" not in url:
        return url
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return REDACTED
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    if parts.password is not None:
        netloc = f"{parts.username or ''}:{REDACTED}@{netloc}"
    elif parts.username:
        netloc = f"{REDACTED if lone_user else parts.username}@{netloc}"
    query = urlencode([(k, REDACTED if _SECRET_QUERY.search(k) else v) for k, v in
                       parse_qsl(parts.query, keep_blank_values=True)], safe="<>")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_dsn(dsn: str | None) -> str | None:
    """A PostgreSQL DSN without its password, as a URL or as key=value words."""
    if not dsn:
        return dsn
    if "://" in dsn:
        return redact_url(dsn, lone_user=False)
    return _DSN_PASSWORD.sub(lambda m: f"{m.group(1)}={REDACTED}", dsn)


def redact_endpoint(url: str | None) -> str | None:
    """An endpoint's scheme, host and port only, for the webhook and the tracing endpoint: whatever else it carries
    is often the secret (a Slack hook's path, a token in a collector's path, ``?code=`` or ``?x-honeycomb-team=``,
    a fragment, ``user:pass@``). Each part left out shows as ``<redacted>`` (userinfo before the host, the rest as
    the path), so the reader knows one was there. A value without a scheme (``user:pass@collector:4317``) is read
    as a host; one that does not parse is ``<redacted>`` whole."""
    if not url:
        return url
    schemed = "://" in url
    try:
        parts = urlsplit(url if schemed else "//" + url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return REDACTED
    if not host or not (parts.scheme or not schemed):
        return REDACTED
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    if "@" in parts.netloc:
        netloc = f"{REDACTED}@{netloc}"
    rest = parts.path not in ("", "/") or parts.query or parts.fragment or url.rstrip().endswith(("?", "#"))
    shown = urlunsplit((parts.scheme, netloc, "/" + REDACTED if rest else "", "", ""))
    return shown if schemed else shown.removeprefix("//")


def redacted(policy: Policy) -> dict[str, Any]:
    """The policy as JSON data with its secrets out (see the module's docstring)."""
    data = policy.model_dump(mode="json")
    server = data["server"]
    for name in ("admin_token_sha256", "metrics_token_sha256", "finance_token_sha256"):
        if server.get(name):
            server[name] = REDACTED
    if server["sso"] is not None and server["sso"]["client_secret"]:
        server["sso"]["client_secret"] = REDACTED
    for tenant in data["tenants"].values():
        tenant["keys"] = [key_id(k.removeprefix("sha256:")) for k in tenant["keys"]]
    data["spend"]["webhook_url"] = redact_endpoint(data["spend"]["webhook_url"])
    data["tracing"]["endpoint"] = redact_endpoint(data["tracing"]["endpoint"])
    dsn = data["state"]["postgres_dsn"]
    shown: dict[str, Any] = _without_userinfo(data)  # state.redis_url, workers' URLs and whatever comes next
    shown["state"]["postgres_dsn"] = redact_dsn(dsn)  # its user is no secret
    return shown


def with_live_values(text: str, live: Policy) -> str:
    """A policy document as GET /admin/policy gave it, with what that redacted put back from ``live``: each value
    still as it was shown (a ``<redacted>`` token hash, a key id among a tenant's keys, a URL with its secrets
    replaced) is the live value again, so the document read, edited and put back changes only what was edited.
    A value written anew is taken as written. ``text`` is returned unchanged when nothing was put back (its
    comments kept); otherwise as YAML (blocking: on a thread). What does not parse is returned as it is, for the
    loader to refuse with its line."""
    try:
        data = load_yaml(text)
    except PolicyError:
        return text
    if not isinstance(data, dict):
        return text
    put_back = [0]
    restored = _restore(data, redacted(live), live.model_dump(mode="json"), put_back)
    left = _still_redacted(restored, "")
    if left:
        raise PolicyError([(path, "still as GET /admin/policy showed it (redacted): only a value shown unchanged in "
                            "its place is put back; write this one in full") for path in left[:MAX_AUDITED_CHANGES]])
    if not put_back[0]:
        return text
    return yaml.safe_dump(restored, sort_keys=False, allow_unicode=True)


_KEY_ID = re.compile(r"key-[0-9a-f]{12}")
_ACTION = re.compile(r"[a-z_]{1,32}(\.[a-z_]{1,32}){0,3}")
# what a document holding a redaction contains somewhere: <redacted> (as JSON may escape it too) or a key id
_MAY_HOLD_REDACTIONS = re.compile(r"<redacted>|\\u003credacted\\u003e|key-[0-9a-f]{12}", re.IGNORECASE)


def _still_redacted(value: Any, path: str) -> list[str]:
    """The paths of ``value`` that still hold a redaction: ``<redacted>`` in a string, or a key id where a tenant's
    key hash belongs."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _still_redacted(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list):
        keys = path.startswith("tenants.") and path.endswith(".keys")
        return [p for i, v in enumerate(value)
                for p in ([f"{path}.{i}"] if keys and isinstance(v, str) and _KEY_ID.fullmatch(v) else
                          _still_redacted(v, f"{path}.{i}"))]
    return [path] if isinstance(value, str) and REDACTED in value else []


def _restore(given: Any, shown: Any, raw: Any, put_back: list[int]) -> Any:
    """``given`` with each value equal to its place's ``shown`` (where that differs from ``raw``) as ``raw``.
    Mappings by key; lists by place for mappings in them, and by value for the items shown otherwise (a
    tenant's key ids, reordered or some removed, are still its keys)."""
    if isinstance(given, dict) and isinstance(shown, dict) and isinstance(raw, dict):
        return {k: _restore(v, shown[k], raw[k], put_back) if k in shown and k in raw else v
                for k, v in given.items()}
    if isinstance(given, list) and isinstance(shown, list) and isinstance(raw, list) and len(shown) == len(raw):
        by_value = {s: r for s, r in zip(shown, raw, strict=True) if isinstance(s, str) and s != r}
        out = []
        for i, item in enumerate(given):
            if isinstance(item, str) and item in by_value:
                put_back[0] += 1
                out.append(by_value[item])
            elif isinstance(item, dict) and i < len(shown):
                out.append(_restore(item, shown[i], raw[i], put_back))
            else:
                out.append(item)
        return out
    if isinstance(given, str) and given == shown and shown != raw:
        put_back[0] += 1
        return raw
    return given


def _without_userinfo(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_userinfo(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_userinfo(v) for v in value]
    if isinstance(value, str) and "://" in value and ("@" in value or "?" in value):
        return redact_url(value)
    return value


def policy_changes(old: Policy, new: Policy) -> tuple[list[dict[str, Any]], int]:
    """Each path added, removed or changed, with its old and new values as GET /admin/policy shows them (a
    changed secret: both redacted, so the entry says that it changed): (the first MAX_AUDITED_CHANGES, how many)."""
    found: list[dict[str, Any]] = []
    _changes(old.model_dump(mode="json"), new.model_dump(mode="json"), redacted(old), redacted(new), "", found)
    return found[:MAX_AUDITED_CHANGES], len(found)


def _changes(a: Any, b: Any, shown_a: Any, shown_b: Any, prefix: str, out: list[dict[str, Any]],
             keys: tuple[str | int, ...] = ()) -> None:
    """gateway.policy.loader.diff's walk, over the raw values (a changed secret is a change) beside the shown
    ones (what the entry says). Redaction replaces leaves only, so the two trees have one shape. Each change names
    its ``path`` dotted, for people, and its ``keys`` one by one (a name may hold dots), for a rollback."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            where = [*keys, key]
            if key not in a:
                out.append({"path": path, "keys": where, "change": "added", "new": _bounded(shown_b[key])})
            elif key not in b:
                out.append({"path": path, "keys": where, "change": "removed", "old": _bounded(shown_a[key])})
            else:
                _changes(a[key], b[key], shown_a[key], shown_b[key], path, out, (*keys, key))
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _changes(x, y, shown_a[i], shown_b[i], f"{prefix}.{i}", out, (*keys, i))
    elif a != b:
        out.append({"path": prefix or "<root>", "keys": list(keys), "change": "changed", "old": _bounded(shown_a),
                    "new": _bounded(shown_b)})


def _bounded(value: Any) -> Any:
    size = len(orjson.dumps(value))
    return value if size <= MAX_AUDITED_VALUE else {"omitted": f"{size} bytes of JSON"}


async def get_policy(request: Request) -> Response:
    """The live policy, secrets redacted: JSON, or YAML with ?format=yaml."""
    await require_admin(request)
    form = request.query_params.get("format", "json")
    if form not in ("json", "yaml"):
        raise InvalidRequest("format is json or yaml.", "invalid_format", param="format")
    snapshot = gateway_of(request).store.current
    data = await asyncio.to_thread(redacted, snapshot.policy)  # a policy of 100,000 tenants takes a while
    headers = {"x-tollgate-policy-digest": snapshot.digest}
    if form == "yaml":
        text = await asyncio.to_thread(lambda: yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        return Response(text, headers=headers, media_type="application/yaml")
    response = json_response(data)
    response.headers.update(headers)
    return response


async def put_policy(request: Request) -> Response:
    """Apply a policy document (YAML or JSON); ``?dry_run=true`` checks it and says what would change, applying
    and recording nothing. A ``<redacted>`` value left as GET /admin/policy showed it keeps the live value."""
    actor = await require_admin(request)
    dry_run = request.query_params.get("dry_run", "false")
    if dry_run not in ("true", "false"):
        raise InvalidRequest("dry_run is true or false.", "invalid_value", param="dry_run")
    raw = await read_body(request.receive, request_headers(request.scope), MAX_POLICY_BYTES)
    written = raw.decode("utf-8", errors="replace")
    if dry_run == "true":
        return await _checked(gateway_of(request).store, written)
    return await _applied(request, actor, written, "policy.apply", {})


async def _checked(store: PolicyStore, written: str) -> Response:
    before = store.current
    try:
        text = await _live_values_in(written, before.policy)
        after = await store.check_text(text, lines_from=written if text is not written else None)
    except PolicyError as exc:
        raise _rejected(exc) from None
    valued, total = await asyncio.to_thread(policy_changes, before.policy, after.policy)
    return json_response({"status": "valid", "digest": after.digest, "changes": valued, "changes_total": total})


async def _applied(request: Request, actor: str, written: str, action: str, extra: dict[str, Any],
                   expected: PolicySnapshot | None = None) -> Response:
    """Make ``written`` the live policy, recording it (or its refusal) in the audit log as ``action``; with
    ``expected``, only while that is still the live policy (409 ``policy_changed`` otherwise)."""
    store = gateway_of(request).store
    before = expected or store.current
    try:
        text = await _live_values_in(written, before.policy)
        changes = await store.apply_text(text, lines_from=written if text is not written else None,
                                         expected=expected.digest if expected is not None else None)
    except PolicyChanged:
        raise Conflict("The policy changed while this was prepared; read it again and retry.",
                       "policy_changed") from None
    except PolicyError as exc:
        await audited(request, actor, "policy.reject", "policy", {
            **extra, "digest": before.digest, "errors": [p for p, _ in exc.errors[:MAX_AUDITED_CHANGES]],
            "errors_total": len(exc.errors)})
        raise _rejected(exc) from None
    after = store.current
    valued, total = await asyncio.to_thread(policy_changes, before.policy, after.policy)
    await audited(request, actor, action, "policy", {
        **extra, "digest": {"old": before.digest, "new": after.digest}, "changes": valued, "changes_total": total})
    return json_response({"status": "applied", "digest": after.digest, "diff": changes, "changes": valued,
                          "changes_total": total})


async def _live_values_in(written: str, live: Policy) -> str:
    if _MAY_HOLD_REDACTIONS.search(written):  # a document GET /admin/policy gave, maybe: its values back
        return await asyncio.to_thread(with_live_values, written, live)
    return written


def _rejected(exc: PolicyError) -> InvalidRequest:
    rejected = InvalidRequest("The policy was rejected; the running one stays.", "invalid_policy")
    rejected.details = [{"path": p, "message": m} for p, m in exc.errors]
    return rejected


async def rollback_policy(request: Request) -> Response:
    """Undo one change to the policy: ``{"entry": <the id of its policy.apply or policy.rollback entry in the
    audit log>}``. Each path the entry changed goes back to its old value, on the policy as it is now; the rest
    stays. Refused (409, naming the paths) where a path has changed again since, where the entry keeps only some
    of its changes or a value too large to keep, where a path names two places (a name holding dots), or where
    the policy changed while the rollback was prepared; and (400) where a value was a secret, which the log never
    keeps: write that one in full. Recorded as ``policy.rollback`` with the entry it undid."""
    actor = await require_admin(request)
    raw = await read_body(request.receive, request_headers(request.scope), 4096)
    try:
        asked = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError:
        raise InvalidRequest("The body is not valid JSON.", "invalid_json") from None
    entry_id = asked.get("entry") if isinstance(asked, dict) else None
    if not isinstance(entry_id, str) or not 0 < len(entry_id) <= 64:
        raise InvalidRequest('Name the change to undo: {"entry": "<its audit entry id>"}.', "invalid_value",
                             param="entry")
    store = gateway_of(request).keys.store
    entry = await store.do(store.audit_entry, entry_id)
    if entry is None or entry["action"] not in ("policy.apply", "policy.rollback"):
        raise NotFound(f"No applied policy change has the audit entry id {entry_id!r}.", "entry_not_found")
    details = orjson.loads(entry["details"])
    changes = details.get("changes") or []
    if details.get("truncated") or details.get("changes_total", len(changes)) > len(changes):
        raise Conflict(f"The entry keeps {len(changes)} of its {details.get('changes_total')} changes: undo it by "
                       "writing the policy in full.", "rollback_incomplete")
    secret = [str(c.get("path")) for c in changes if _still_redacted([c.get("old"), c.get("new")], "")]
    if secret:
        raise InvalidRequest(f"Cannot undo this change: {', '.join(secret[:20])} held a secret, whose old value the "
                             "log never keeps; write the policy in full.", "rollback_secret")
    live = gateway_of(request).store.current
    shown = await asyncio.to_thread(redacted, live.policy)
    problems = undo(shown, changes)
    if problems:
        raise Conflict("Cannot undo this change: " + "; ".join(problems[:20]), "rollback_conflict")
    text = await asyncio.to_thread(lambda: yaml.safe_dump(shown, sort_keys=False, allow_unicode=True))
    return await _applied(request, actor, text, "policy.rollback", {"rollback_of": entry_id}, expected=live)


def undo(shown: dict[str, Any], changes: list[dict[str, Any]]) -> list[str]:
    """Put each change's old value back into ``shown`` (the live policy as GET /admin/policy shows it), the last
    change first; the paths that cannot be (changed since, their value not kept, or naming two places), each
    with why."""
    problems = []
    for change in reversed(changes):
        path, kind = str(change.get("path", "")), change.get("change")
        if _omitted(change.get("old")) or _omitted(change.get("new")):
            problems.append(f"{path}: its value was too large for the log")
            continue
        keys = change.get("keys")
        found = _at(shown, keys) if isinstance(keys, list) and keys else _places(shown, path.split("."))
        places = [(parent, key) for parent, key in found if _present(parent, key) == (kind != "removed")]
        if kind != "removed":
            places = [(parent, key) for parent, key in places if parent[key] == change.get("new")]
        if len(places) > 1:
            problems.append(f"{path}: names {len(places)} places (a name with dots in it)")
        elif not places:
            problems.append(f"{path}: changed again since")
        elif kind == "added":
            del places[0][0][places[0][1]]
        else:
            places[0][0][places[0][1]] = change.get("old")
    return problems


def _omitted(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"omitted"}


def _present(parent: Any, key: Any) -> bool:
    return key in parent if isinstance(parent, dict) else key < len(parent)


def _at(tree: Any, keys: list[Any]) -> list[tuple[Any, Any]]:
    """Where a change's ``keys`` lead, one by one (the last need not be there): one place, or none."""
    for key in keys[:-1]:
        if not _holds(tree, key, 0):
            return []
        tree = tree[key]
    return [(tree, keys[-1])] if _holds(tree, keys[-1], 1) else []


def _holds(tree: Any, key: Any, past_end: int) -> bool:
    """Can ``key`` index ``tree`` (a list: within its length, or ``past_end`` beyond it; a mapping: a name)?"""
    if isinstance(tree, list):
        return isinstance(key, int) and 0 <= key < len(tree) + past_end
    return isinstance(tree, dict) and isinstance(key, str) and (past_end == 1 or key in tree)


def _places(tree: Any, parts: list[str]) -> list[tuple[Any, Any]]:
    """Every mapping or list, with the key in it, that a dotted path can name (an entry written before changes
    named their ``keys``): a name may hold dots (a tenant's, a model's), so each way of splitting the path that
    leads through the tree is one. The last key need not be there (a path removed)."""
    if isinstance(tree, list):
        if not parts[0].isdigit() or int(parts[0]) > len(tree):
            return []
        index = int(parts[0])
        if len(parts) == 1:
            return [(tree, index)]
        return _places(tree[index], parts[1:]) if index < len(tree) else []
    if not isinstance(tree, dict):
        return []
    found = [(tree, ".".join(parts))]
    for i in range(1, len(parts)):
        key = ".".join(parts[:i])
        if key in tree:
            found += _places(tree[key], parts[i:])
    return found


async def audit_file_reload(keys: KeyService, reload: FileReload) -> None:
    """Write a reload of the policy file to the audit log as PUT /admin/policy writes its own: applied, with each
    changed path's old and new values (redacted), or refused, with the paths at fault. The actor is the file."""
    try:
        if reload.after is None:
            errors = reload.error.errors if reload.error is not None else []
            await keys.record("file", None, "policy.reject", "policy", {
                "source": reload.source, "digest": reload.before.digest,
                "errors": [p for p, _ in errors[:MAX_AUDITED_CHANGES]], "errors_total": len(errors)})
            return
        if await _applied_by_put(keys, reload.after.digest):
            return  # the file another process of this host wrote for a PUT: that PUT's entry says it
        valued, total = await asyncio.to_thread(policy_changes, reload.before.policy, reload.after.policy)
        if total:
            await keys.record("file", None, "policy.apply", "policy", {
                "source": reload.source, "digest": {"old": reload.before.digest, "new": reload.after.digest},
                "changes": valued, "changes_total": total})
    except Exception as exc:  # the reload is done: an entry the store cannot take goes to the log
        log.error("audit entry of a policy file reload not stored (%s)", exc)


async def _applied_by_put(keys: KeyService, digest: str, within_s: float = 600.0) -> bool:
    """Did a PUT /admin/policy or a rollback (on any process sharing the audit log) apply the policy of ``digest``
    within the last ``within_s``? Its newest entries are read, a few."""
    now = time.time()
    recent = await keys.audit(times.at(now - within_s), times.at(now + 1), 20)
    return any(e["action"] in ("policy.apply", "policy.rollback") and e["actor"] != "file"
               and (e["details"].get("digest") or {}).get("new") == digest for e in recent)


async def audit_log(request: Request) -> Response:
    """The audit log, newest first: ?from= &to= (ISO dates or times, UTC; as the cost reports read them)
    &action= (that action and those under it) &limit= (1-1000, default 100) &cursor= (the last page's
    ``next_cursor``: the entries after it, in the same range). A page holds at most ``limit`` entries and
    ``AUDIT_PAGE_BYTES`` of their JSON (always one entry, each bounded far below it); ``has_more`` says whether
    another follows, and ``next_cursor`` is where it starts.
    Each entry names its ``client`` and its ``peer`` (see ``client_address``)."""
    await require_admin(request)
    start, end = time_range(request)
    text = request.query_params.get("limit", "100")
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 1000:
        raise InvalidRequest("limit is a whole number from 1 to 1000.", "invalid_limit", param="limit")
    after = parse_cursor(request.query_params.get("cursor"))
    action = request.query_params.get("action")
    if action is not None and not _ACTION.fullmatch(action):
        raise InvalidRequest("action is an action's name or its first part (policy, key.create ...).",
                             "invalid_value", param="action")
    store = gateway_of(request).keys.store
    rows, more = await store.do(store.audit_page, start, end, int(text), after, AUDIT_PAGE_BYTES, action)
    entries = [{**row, **shown_client(row["client"]), "details": orjson.Fragment(row["details"])} for row in rows]
    return json_response({"object": "list", **shown_range(start, end), "data": entries, "has_more": more,
                          "next_cursor": cursor_of(rows[-1]) if more else None})


def cursor_of(row: dict[str, Any]) -> str:
    """Where the page after ``row`` starts: its time and id, opaque to the caller."""
    return base64.urlsafe_b64encode(orjson.dumps([row["time"], row["id"]])).decode().rstrip("=")


def parse_cursor(text: str | None) -> tuple[str, str] | None:
    """A ``cursor`` as (time, id); anything this gateway did not hand out is a 400."""
    if text is None:
        return None
    try:
        time_, id_ = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        if isinstance(time_, str) and isinstance(id_, str) and len(time_) <= 40 and len(id_) <= 64 and \
                times.sortable(datetime.fromisoformat(time_)) == time_:  # a time as entries hold it: compared
            return time_, id_  # with the period's ends in Python and in the store, which agree on that form
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        pass
    raise InvalidRequest("cursor is the next_cursor of an earlier page of /admin/audit.", "invalid_cursor",
                         param="cursor")


async def policy_status(request: Request) -> Response:
    await require_admin(request)
    return json_response(gateway_of(request).store.status())


async def purge_cache(request: Request) -> Response:
    actor = await require_admin(request)
    gw = gateway_of(request)
    q = request.query_params
    repeated = sorted(k for k in set(q.keys()) if len(q.getlist(k)) > 1)
    if repeated:
        raise InvalidRequest(f"Give each selector once: {', '.join(repeated)} repeated.", "repeated_parameter")
    if gw.cache is None:
        raise Conflict("The cache is not enabled in the policy.", "cache_disabled")
    if not (q.get("tenant") or q.get("model") or q.get("id") or q.get("all") == "true"):
        raise InvalidRequest("Say what to purge: tenant=, model=, id= or all=true.", "missing_selector")
    for name in ("tenant", "model", "id"):
        refuse_unsafe(name, q.get(name))
    try:
        purged = await gw.cache.purge(q.get("tenant"), q.get("model"), q.get("id"))
    except StoreUnavailable:
        raise Unavailable("The cache store is unreachable.", "cache_store_down") from None
    selector = {k: q[k] for k in ("tenant", "model", "id", "all") if q.get(k)}
    await audited(request, actor, "cache.purge", ",".join(f"{k}={v}" for k, v in selector.items())[:200],
                  {**selector, "purged": purged})
    return json_response({"purged": purged})


def refuse_unsafe(param: str, text: str | None) -> None:
    """A 400 naming ``param`` when free text an admin sent (and the audit keeps) holds a character that can hide or
    reorder what a terminal or a page shows (gateway.keys.model.unsafe_character)."""
    found = unsafe_character(text or "")
    if found is not None:
        raise InvalidRequest(f"{param}: {found}", "invalid_value", param=param)


async def cache_status(request: Request) -> Response:
    """The cache on this replica: its embedder, entries, per tenant its cacheability (``answers``, and the models
    that differ), the outcomes so far and the bypasses by reason (this replica's metrics, all tenants), and per
    audited scope its audits, disagreements, the upper confidence bound of its false-hit rate and the threshold it
    has earned (``?tenant=`` filters the tenants and the scopes)."""
    await require_admin(request)
    gw = gateway_of(request)
    if gw.cache is None:
        raise Conflict("The cache is not enabled in the policy.", "cache_disabled")
    spec = gw.store.current.policy.cache
    tenant = request.query_params.get("tenant")
    tenants = {name: {"answers": view.cache, "models": dict(view.cache_models)}
               for name, view in gw.store.current.tenants.items() if tenant is None or name == tenant}
    scopes = [s for s in gw.cache.audits.report(spec.audit, spec.threshold) if tenant is None or s["tenant"] == tenant]
    audited = sum(s["audited"] for s in scopes)
    wrong = sum(s["disagreed"] for s in scopes)
    return json_response({
        "embedder": gw.cache.embedder.name if gw.cache.embedder is not None else None,
        "entries": len(gw.cache.index) if gw.cache.index is not None else 0, "threshold": spec.threshold,
        "audit": {"enabled": spec.audit.enabled, "every": spec.audit.every, "pending": len(gw.cache.audits.pending),
                  "audited": audited, "disagreed": wrong,
                  "false_hit_rate": round(wrong / audited, 6) if audited else None,
                  "max_false_hit_rate": spec.audit.max_false_hit_rate},
        "tenants": tenants, "outcomes": _counted(gw.metrics.cache_requests, "result"),
        "bypassed": _counted(gw.metrics.cache_bypass, "reason"), "scopes": scopes})


def _counted(counter: Any, label: str) -> dict[str, int]:
    """A counter's totals by one of its labels (summed over the others), as /metrics has them."""
    totals: dict[str, int] = {}
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                key = sample.labels[label]
                totals[key] = totals.get(key, 0) + int(sample.value)
    return totals


async def queues(request: Request) -> Response:
    """Per pool: its workers admitted for routing, requests started, drain rate, and per class the depth, oldest
    wait and depth by tenant; and the prompt blocks the prefix index places on each worker (what routing believes
    each engine caches). Per model: its pool and whether that pool can serve it now."""
    await require_admin(request)
    gw = gateway_of(request)
    upstreams = gw.upstreams.pools
    pools = gw.scheduler.snapshot(upstreams)
    for name, view in pools.items():
        view["healthy_workers"] = upstreams[name].healthy_workers()
        footprint = upstreams[name].router.index.footprint
        view["prefix_blocks"] = {w.url: footprint[w.url] for w in upstreams[name].workers}
    policy = gw.store.current.policy
    models = {name: {"pool": policy.models[name].pool, "ready": ok} for name, ok in gw.servable().items()}
    return json_response({"mode": policy.scheduling.mode, "pools": pools, "models": models})


async def anomalies(request: Request) -> Response:
    """Recent alerts (cost anomalies, spend rate, budget thresholds), newest first; ?tenant= &kind= filter."""
    await require_admin(request)
    q = request.query_params
    found = [public(a) for a in reversed(gateway_of(request).alerts.recent)
             if (not q.get("tenant") or a.get("tenant") == q["tenant"])
             and (not q.get("kind") or a["kind"] == q["kind"])]
    return json_response({"object": "list", "data": found})


async def scale(request: Request) -> Response:
    """Per pool: the desired worker count by the scaling rules, why, and the signals behind it."""
    await require_admin(request)
    return json_response({"pools": gateway_of(request).autoscaler.last})


ROUTES = [
    Route("/admin/scale", scale, methods=["GET"]),
    Route("/admin/anomalies", anomalies, methods=["GET"]),
    Route("/admin/queues", queues, methods=["GET"]),
    Route("/admin/policy", put_policy, methods=["PUT"]),
    Route("/admin/policy", get_policy, methods=["GET"]),
    Route("/admin/audit", audit_log, methods=["GET"]),
    Route("/admin/policy/status", policy_status, methods=["GET"]),
    Route("/admin/policy/rollback", rollback_policy, methods=["POST"]),
    Route("/admin/cache", purge_cache, methods=["DELETE"]),
    Route("/admin/cache", cache_status, methods=["GET"]),
]
