"""The one map from transport failures to the gateway's errors, as httpx/_transports/default.py maps httpcore's.

A worker failure does two things: the worker leaves routing for its cooldown, and the request ends in
``UpstreamFailed``, whose client message names no internals (no host:port, no exception class); the worker and the
reason stay in the request's log line and the worker's last_error.
"""

from __future__ import annotations

from types import TracebackType

from gateway.errors import Unavailable, UpstreamFailed
from gateway.fleet.observe import cool_down, describe
from gateway.fleet.worker import Worker
from gateway.transport.http1 import ConnectFailed, PoolBusy, UpstreamError

TRANSPORT_ERRORS = (UpstreamError, TimeoutError)
RETRYABLE_STATUS = frozenset({500, 502, 503, 504})  # retried on another worker before the first byte
COOLDOWN_STATUS = frozenset({502, 503, 504})  # the worker is overloaded or down: leave it out for a while

class worker_errors:
    """``with worker_errors(worker, phase, cooldown_s):`` turns a transport failure inside the block into
    UpstreamFailed and cools the worker down. (A class, not @contextmanager: it runs twice per request, and a
    generator-based context manager costs several times more.)"""

    __slots__ = ("cooldown_s", "phase", "worker")

    def __init__(self, worker: Worker, phase: str, cooldown_s: float) -> None:
        self.worker, self.phase, self.cooldown_s = worker, phase, cooldown_s

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, PoolBusy):  # the gateway's own connection limit: the worker did nothing wrong
            raise Unavailable("Every connection to the worker is in use; retry shortly.", "upstream_busy") from None
        if exc is not None and isinstance(exc, TRANSPORT_ERRORS):
            reason = describe(exc)
            cool_down(self.worker, reason, self.cooldown_s)
            # connected, but the head never came: the worker failed before answering, it was not unreachable
            phase = "head" if self.phase == "connect" and not isinstance(exc, ConnectFailed) else self.phase
            raise UpstreamFailed(phase, reason) from None
