"""Load, check, diff and hot-reload the policy.

A policy is parsed and validated once into an immutable ``PolicySnapshot``. Reloading swaps the
store's reference; a request keeps the snapshot it started with, so in-flight requests finish
under their own policy. A bad file never replaces a good one: the error is kept for
``/admin/policy/status`` and the metrics.

Parsing, building and diffing all run on a thread, never on the event loop: a policy of 100,000 tenants
takes seconds to read. The YAML is bounded before it is built: aliases may be used, but what they expand to
is counted (``MAX_YAML_NODES``; a 2.7 KB alias bomb expands to hundreds of millions) and an alias that refers
to itself is refused, as is a text over ``MAX_POLICY_BYTES``. A key given twice in one mapping is an error
naming both lines, never a silent "the last one wins". JSON (which is YAML) is read by the json module's C
scanner, and YAML by libyaml where it is installed. The file watcher outlives any file: whatever goes wrong in
one reload is recorded as a rejection and the next change (or SIGHUP) is read as usual.
"""

from __future__ import annotations

import asyncio
import difflib
import gc
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType, UnionType
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, Union, get_args, get_origin

import orjson
import yaml
from pydantic import BaseModel, ValidationError

from gateway.policy.schema import (
    AnomalyRule,
    Budget,
    CacheAnswers,
    Policy,
    RateLimit,
    Tier,
    cross_reference_errors,
)

log = logging.getLogger("tollgate.policy")
T = TypeVar("T")


class PolicyError(Exception):
    """Every problem found in one policy, each with its dotted path."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("\n".join(f"{path}: {message}" for path, message in errors))


@dataclass(frozen=True, slots=True)
class TenantView:
    """What the hot path needs about a tenant, resolved against its tier once at load."""

    name: str
    tier: Tier
    models: frozenset[str] | None  # None: every model
    max_tokens_default: int
    max_tokens_cap: int
    on_exceed: str
    cache: CacheAnswers = "low_temperature"  # which of its answers the response cache may serve (schema.TenantCache)
    cache_models: tuple[tuple[str, CacheAnswers], ...] = ()  # the models whose setting differs from ``cache``
    weight: float = 1.0  # share of its class's capacity under contention
    budget: Budget | None = None
    rate_limit: RateLimit | None = None
    anomaly: AnomalyRule = field(default_factory=AnomalyRule)  # the tenant's own rule, else its tier's
    prefix_cache: str = "salted"  # salted: a cache_salt of its own on every request; shared: the engine-wide cache
    # Whose budgets and rate limits a request is counted against, by scope (the tenant's name; a runtime key's
    # is "#" and its meter, gateway.keys.model): derived once here, read by every request.
    budget_scopes: tuple[tuple[str, Budget], ...] = field(default=(), compare=False)
    rate_scopes: tuple[tuple[str, RateLimit], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not self.budget_scopes and self.budget is not None:
            object.__setattr__(self, "budget_scopes", ((self.name, self.budget),))
        if not self.rate_scopes and self.rate_limit is not None:
            object.__setattr__(self, "rate_scopes", ((self.name, self.rate_limit),))

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models

    def cache_answers(self, model: str) -> CacheAnswers:
        """Which of this tenant's answers of ``model`` the response cache may serve."""
        for name, answers in self.cache_models:
            if name == model:
                return answers
        return self.cache


@dataclass(frozen=True)
class PolicySnapshot:
    policy: Policy
    digest: str
    source: str
    loaded_at: float
    tenants_by_key: Mapping[str, TenantView]  # sha256 hex of the key -> tenant
    tenants: Mapping[str, TenantView]

    @classmethod
    def build(cls, policy: Policy, source: str, digest: str | None = None) -> PolicySnapshot:
        """``digest``: the policy's, when it was computed elsewhere (``parse_elsewhere``)."""
        tenants: dict[str, TenantView] = {}
        by_key: dict[str, TenantView] = {}
        for name, tenant in policy.tenants.items():
            tier = policy.tiers[tenant.tier]
            view = TenantView(
                name=name, tier=tenant.tier,
                models=None if "*" in tenant.models else frozenset(tenant.models),
                max_tokens_default=tier.max_tokens_default,
                max_tokens_cap=tenant.max_tokens_cap or tier.max_tokens_cap,
                on_exceed=tier.on_exceed, cache=tenant.cache.answers,
                cache_models=tuple(sorted(tenant.cache.models.items())), weight=tenant.weight,
                budget=tenant.budget, rate_limit=tenant.rate_limit, anomaly=tenant.anomaly or tier.anomaly,
                prefix_cache=tenant.prefix_cache,
            )
            tenants[name] = view
            for key in tenant.keys:
                by_key[key.removeprefix("sha256:")] = view
        return cls(policy, digest or digest_of(policy), source, time.time(), MappingProxyType(by_key),
                   MappingProxyType(tenants))


def digest_of(policy: Policy) -> str:
    """A short name for the policy's content, whatever its formatting."""
    return hashlib.sha256(orjson.dumps(policy.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


MAX_POLICY_BYTES = 64 * 1024 * 1024
MAX_YAML_NODES = 5_000_000  # 100,000 tenants are about a million
_AS_TEXT = frozenset({"tag:yaml.org,2002:str", "tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"})


if TYPE_CHECKING:  # a mixin of the loaders below, typed as what it mixes into (at run time: object)
    _Loader = yaml.SafeLoader
    _FastBase = yaml.SafeLoader  # libyaml's CSafeLoader has the same surface
else:
    _Loader = object
    _FastBase = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeys(_Loader):
    """Refuses a mapping that gives one key twice, naming both lines (the last one won silently: an admin's
    second ``tier:`` line moved a tenant to premium). Checked as each mapping is built, before a merge (``<<``)
    folds other mappings' keys into it, so a key that overrides a merged one is no duplicate."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._checked: set[int] = set()

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        if id(node) not in self._checked:  # the first pass, before any merge changed node.value
            self._checked.add(id(node))
            seen: dict[Any, yaml.Mark] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a collection as a key: the constructor refuses it
                tag = key_node.tag  # a string is its text; anything else (1, true, 0x1) is built to compare
                key = key_node.value if tag in _AS_TEXT else self.construct_object(key_node)
                first = seen.get(key)
                if first is not None:
                    raise PolicyError([(_where(key_node), f"the key {_shown(key_node.value)} is given twice in one "
                                        f"mapping, on line {first.line + 1} and line {key_node.start_mark.line + 1}")])
                seen[key] = key_node.start_mark
        super().flatten_mapping(node)


def _shown(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 60 else text[:57] + "..."


class _FastLoader(_UniqueKeys, _FastBase):
    """libyaml's parser where it is installed: 2.5x faster on a large policy."""


class _PlainLoader(_UniqueKeys, yaml.SafeLoader):
    """The Python parser: it says where a syntax error is as people count lines (libyaml names the end)."""


class _RepeatedKey(Exception):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) != len(pairs):
        raise _RepeatedKey  # the YAML loader then names the key and its lines
    return data


def load_yaml(text: str) -> Any:
    """YAML (or JSON) text as plain data, refusing what would expand past MAX_YAML_NODES or into itself, and a
    key given twice in one mapping."""
    if len(text) > MAX_POLICY_BYTES:
        raise PolicyError([("<root>", f"the policy is over {MAX_POLICY_BYTES} bytes")])
    try:
        return _load(text)
    except RecursionError:
        raise PolicyError([("<root>", "the policy is nested too deeply")]) from None


def _load(text: str) -> Any:
    if text.lstrip().startswith("{"):  # JSON is YAML; the json module reads it 25x faster (with the key check)
        try:
            return json.loads(text, object_pairs_hook=_unique)
        except (ValueError, _RepeatedKey):
            pass  # YAML's flow style, or a key given twice, then
    try:
        return _load_bounded(text, _FastLoader)
    except yaml.YAMLError:
        pass
    try:
        return _load_bounded(text, _PlainLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "document"
        raise PolicyError([(where, f"invalid YAML: {getattr(exc, 'problem', exc)}")]) from None


def _load_bounded(text: str, kind: Any) -> Any:
    loader = kind(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _bounded(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _bounded(root: yaml.Node) -> None:
    """Count the nodes the document expands to (an alias counts as all it refers to), without expanding it."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > MAX_YAML_NODES:
                raise PolicyError([(_where(node), f"the YAML expands to over {MAX_YAML_NODES} values "
                                                  "(an alias repeated inside aliases?)")])
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise PolicyError([(_where(node), "a YAML alias refers to the value that contains it")])
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _where(node: yaml.Node) -> str:
    mark = node.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "document"


def parse_policy(text: str, lines_from: str | None = None) -> Policy:
    """YAML text -> validated Policy, or PolicyError listing every problem with its path. ``lines_from``: the
    document as its author wrote it, when ``text`` was rewritten from it with the same shape (an error's line is
    read there)."""
    data = load_yaml(text)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError([("<root>", "the policy must be a mapping")])
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(_explained(lines_from or text, exc)) from None
    except RecursionError:
        raise PolicyError([("<root>", "the policy is nested too deeply")]) from None
    errors = cross_reference_errors(policy)
    if errors:
        raise PolicyError(errors)
    return policy


def _path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in _document_loc(loc)) or "<root>"


def _document_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    # pydantic adds the Literal/union branch to some locations; keep only the document path
    return tuple(p for p in loc if not (isinstance(p, str) and p.startswith(("literal[", "function-"))))


def _explained(text: str, exc: ValidationError) -> list[tuple[str, str]]:
    """Each validation error as (its dotted path, its message with the line it is on, and for a name the schema
    does not know the nearest one it does)."""
    root = _node_of(text)
    explained = []
    for error in exc.errors():
        loc = _document_loc(error["loc"])
        message = error["msg"]
        if error["type"] == "extra_forbidden" and loc:
            near = difflib.get_close_matches(str(loc[-1]), _fields_at(loc[:-1]), n=1, cutoff=0.6)
            if near:
                message += f" (did you mean '{near[0]}'?)"
        line = _line_of(root, loc) if root is not None else None
        if line is not None:
            message += f" (line {line})"
        explained.append((_path(loc), message))
    return explained


def _node_of(text: str) -> yaml.Node | None:
    """The document's node tree (its marks say where each value is), or None when it cannot be had."""
    loader = _FastLoader(text)
    try:
        node: yaml.Node | None = loader.get_single_node()
        return node
    except yaml.YAMLError:
        return None
    finally:
        loader.dispose()


def _line_of(node: yaml.Node, loc: tuple[Any, ...]) -> int | None:
    """The line (from 1) of the deepest value of ``loc`` the document holds; None if it holds none of it."""
    found = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            child = node.value[part]
        else:
            child = None
        if child is None:
            break
        node, found = child, child.start_mark.line + 1
    return found


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The names the schema knows at ``loc`` (a mapping of the document): its model's fields, or none."""
    kind: Any = Policy
    for part in loc:
        kind = _inner(kind, part)
        if kind is None:
            return []
    model = _model_of(kind)
    return list(model.model_fields) if model is not None else []


def _inner(kind: Any, part: Any) -> Any:
    """The type of ``part`` inside a value of type ``kind`` (a model's field, a mapping's value, a list's item)."""
    origin, args = get_origin(kind), get_args(kind)
    if origin is Annotated:
        return _inner(args[0], part)
    if origin in (Union, UnionType):
        for arg in args:
            if arg is not type(None) and (inner := _inner(arg, part)) is not None:
                return inner
        return None
    model = _model_of(kind)
    if model is not None:
        field_info = model.model_fields.get(str(part))
        return field_info.annotation if field_info is not None else None
    if origin in (dict, Mapping) and len(args) == 2:
        return args[1]
    if origin in (list, tuple) and args:
        return args[0]
    return None


def _model_of(kind: Any) -> type[BaseModel] | None:
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None


def load_file(path: Path) -> PolicySnapshot:
    return PolicySnapshot.build(parse_policy(read_file(path)), str(path))


def read_file(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise PolicyError([(str(path), f"cannot read: {exc.strerror}")]) from None


# A policy this large is parsed in a process of its own: libyaml and pydantic hold the GIL for a second or more
# on 100,000 tenants (and the garbage collector, walking millions of new objects, longer), which a thread
# cannot hide from the event loop. Smaller ones parse in tens of milliseconds on a thread.
ELSEWHERE_OVER = 1024 * 1024


async def parse_elsewhere(text: str, source: str, lines_from: str | None = None) -> PolicySnapshot:
    """Parse and validate ``text`` without stalling the event loop, whatever its size (PolicyError if bad;
    ``lines_from`` as parse_policy reads it)."""
    if len(text) <= ELSEWHERE_OVER:
        return await asyncio.to_thread(_quietly, lambda: PolicySnapshot.build(parse_policy(text, lines_from), source))
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        errors, data, digest = await loop.run_in_executor(pool, _checked, text, lines_from)
    if errors:
        raise PolicyError(errors)
    # the child found it valid; here it is only rebuilt, from JSON, with the collector paused
    return await asyncio.to_thread(_quietly, lambda: PolicySnapshot.build(
        Policy.model_validate(orjson.loads(data)), source, digest))


def _checked(text: str, lines_from: str | None = None) -> tuple[list[tuple[str, str]], bytes, str]:
    """In the child: (errors, the policy as JSON, its digest)."""
    try:
        policy = parse_policy(text, lines_from)
    except PolicyError as exc:
        return exc.errors, b"", ""
    return [], orjson.dumps(policy.model_dump(mode="json")), digest_of(policy)


def _quietly(build: Callable[[], T]) -> T:
    """Run ``build`` with the cyclic garbage collector paused: it would walk every object of a large policy
    several times over while the policy is being made (refcounting still frees what is dropped)."""
    was = gc.isenabled()
    gc.disable()
    try:
        return build()
    finally:
        if was:
            gc.enable()


def diff(old: Policy, new: Policy) -> dict[str, list[str]]:
    """Dotted paths added, removed and changed between two policies (values of keys are not shown)."""
    changes: dict[str, list[str]] = {"added": [], "removed": [], "changed": []}
    _diff(old.model_dump(mode="json"), new.model_dump(mode="json"), "", changes)
    return changes


def _diff(a: object, b: object, prefix: str, out: dict[str, list[str]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in a:
                out["added"].append(path)
            elif key not in b:
                out["removed"].append(path)
            else:
                _diff(a[key], b[key], path, out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{prefix}.{i}", out)
    elif a != b:
        out["changed"].append(prefix or "<root>")


Listener = Callable[[PolicySnapshot], None]


@dataclass(frozen=True, slots=True)
class FileReload:
    """A reload of the policy file as the watcher saw it: applied (``after``) or refused (``error``)."""

    source: str
    before: PolicySnapshot
    after: PolicySnapshot | None = None
    error: PolicyError | None = None


FileWatcher = Callable[[FileReload], Awaitable[None]]


class PolicyChanged(Exception):
    """The live policy was replaced by another while a change made from it was being checked."""

    def __init__(self, digest: str) -> None:
        super().__init__(f"the live policy is now {digest}")
        self.digest = digest


@dataclass
class PolicyStore:
    """Holds the live snapshot; reloads from the file (watch, SIGHUP) or from text (admin API)."""

    current: PolicySnapshot
    path: Path | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    reloads_ok: int = 0
    reloads_failed: int = 0
    file_checks: int = 0  # the watcher's passes over the file
    file_checked_at: float | None = None
    listeners: list[Listener] = field(default_factory=list)
    rejection_listeners: list[Callable[[PolicyError], None]] = field(default_factory=list)
    file_watchers: list[FileWatcher] = field(default_factory=list)  # told of each reload of the file, after it
    _stamp: tuple[int, int, int] | None = None

    @classmethod
    def from_file(cls, path: Path) -> PolicyStore:
        store = cls(load_file(path), path)
        store._stamp = _stamp(path)
        return store

    def status(self) -> dict[str, Any]:
        """What GET /admin/policy/status shows: the live policy's digest and source, the reloads so far, the last
        error, and the watcher's passes; moments as ISO 8601 UTC times, for a person to read."""
        snap = self.current
        return {"digest": snap.digest, "source": snap.source, "loaded_at": _iso(snap.loaded_at),
                "reloads_ok": self.reloads_ok, "reloads_failed": self.reloads_failed,
                "last_error": self.last_error, "last_error_at": _iso(self.last_error_at),
                "file_checks": self.file_checks, "file_checked_at": _iso(self.file_checked_at)}

    async def apply(self, snapshot: PolicySnapshot, expected: str | None = None) -> dict[str, list[str]]:
        """Make ``snapshot`` live; with ``expected``, only if the live policy still has that digest at the moment
        it is replaced (else PolicyChanged, and nothing changes)."""
        old = self.current.policy
        changes = await asyncio.to_thread(_quietly, lambda: diff(old, snapshot.policy))
        if expected is not None and self.current.digest != expected:
            raise PolicyChanged(self.current.digest)
        self.current = snapshot
        self.reloads_ok += 1
        self.last_error = self.last_error_at = None
        for listener in self.listeners:
            listener(snapshot)
        log.info("policy %s loaded from %s: %s", snapshot.digest, snapshot.source, changes)
        return changes

    def reject(self, error: PolicyError, source: str) -> None:
        self.reloads_failed += 1
        self.last_error = f"{source}:\n{error}"
        self.last_error_at = time.time()
        log.error("policy from %s rejected; keeping %s:\n%s", source, self.current.digest, error)
        for listener in self.rejection_listeners:
            listener(error)

    def _refuse_restart_only(self, policy: Policy) -> None:
        """Where shared state lives is read at start: moving it under live requests would split their state."""
        if policy.state != self.current.policy.state:
            raise PolicyError([("state", "where shared state lives is read at start; restart the gateway to "
                                "change it (this replica keeps the old place meanwhile)")])

    async def reload_file(self) -> dict[str, list[str]]:
        """Re-read the file off the event loop; raise PolicyError (and keep the old one) if it is bad."""
        assert self.path is not None
        self._stamp = _stamp(self.path)
        before, source = self.current, str(self.path)
        try:
            snapshot = await parse_elsewhere(await asyncio.to_thread(read_file, self.path), source)
            self._refuse_restart_only(snapshot.policy)
        except PolicyError as exc:
            self.reject(exc, source)
            await self._tell(FileReload(source, before, error=exc))
            raise
        changes = await self.apply(snapshot)
        await self._tell(FileReload(source, before, after=snapshot))
        return changes

    async def _tell(self, reload: FileReload) -> None:
        for watcher in self.file_watchers:
            try:
                await watcher(reload)
            except Exception:  # a watcher's failure is its own: the reload stands
                log.exception("a policy file watcher failed")

    async def check_text(self, text: str, source: str = "admin API",
                         lines_from: str | None = None) -> PolicySnapshot:
        """What ``apply_text`` would make live, checked as it checks it, and nothing applied or recorded: raises
        PolicyError with every problem."""
        snapshot = await parse_elsewhere(text, source, lines_from)
        policy = snapshot.policy
        if self.current.policy.server.admin_token_sha256 and policy.server.admin_token_sha256 is None:
            raise PolicyError([("server.admin_token_sha256", "removing the admin token through the admin API "
                                "would lock the admin API out; edit the policy file to do that")])
        self._refuse_restart_only(policy)
        return snapshot

    async def apply_text(self, text: str, source: str = "admin API", lines_from: str | None = None,
                         expected: str | None = None) -> dict[str, list[str]]:
        """Validate text and make it live, then write it to the policy file so a restart keeps it.

        The admin API cannot turn itself off: a policy without the admin token is refused here (edit the
        file to do that). The file is written only once the policy is live: to a temporary file first, the
        previous file kept as ``<name>.bak``, then renamed into place (atomic on POSIX)."""
        try:
            snapshot = await self.check_text(text, source, lines_from)
        except PolicyError as exc:
            self.reject(exc, source)
            raise
        changes = await self.apply(snapshot, expected)
        if self.path is not None:
            await asyncio.to_thread(_write_with_backup, self.path, text)
            self._stamp = _stamp(self.path)
        return changes

    async def watch(self, interval: float = 1.0) -> None:
        """Reload when the file changes (mtime, size or inode) and on SIGHUP."""
        loop = asyncio.get_running_loop()
        hup = asyncio.Event()
        sighup = getattr(signal, "SIGHUP", None)  # POSIX only; file watching works everywhere
        if sighup is not None and threading.current_thread() is threading.main_thread():
            loop.add_signal_handler(sighup, hup.set)
        while True:
            try:
                await asyncio.wait_for(hup.wait(), interval)
            except TimeoutError:
                pass
            forced = hup.is_set()
            hup.clear()
            if self.path is None:
                continue
            if forced or _stamp(self.path) != self._stamp:
                try:
                    await self.reload_file()
                except PolicyError:
                    pass  # recorded by reload_file
                except Exception as exc:  # a bug or a resource error: recorded, and the watch goes on
                    log.exception("policy reload from %s failed", self.path)
                    self.reject(PolicyError([("<root>", f"the reload failed: {type(exc).__name__}")]), str(self.path))
            self.file_checks += 1  # a watcher that stopped shows here: the count no longer moves
            self.file_checked_at = time.time()


def _iso(moment: float | None) -> str | None:
    if moment is None:
        return None
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _write_with_backup(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        shutil.copy2(path, path.with_name(path.name + ".bak"))
    os.replace(tmp, path)
