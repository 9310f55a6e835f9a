"""The one map from transport failures to the gateway's errors, as httpx/_transports/default.py maps httpcore's.

A worker failure does two things: the worker leaves routing for its cooldown, and the request ends in
``UpstreamFailed``, whose client message names no internals (no host:port, no exception class); the worker and the
reason stay in the request's log line and the worker's last_error.
"""

from __future__ import annotations

from gateway.errors import AnswerTooLarge, Unavailable, UpstreamFailed
from gateway.fleet.observe import cool_down, describe
from gateway.fleet.worker import Worker
from gateway.transport.http1 import BodyTooLarge, ConnectFailed, PoolBusy, StateError, UpstreamError

TRANSPORT_ERRORS = (UpstreamError, TimeoutError)
RETRYABLE_STATUS = frozenset({500, 502, 503, 504})  # retried on another worker before the first byte
COOLDOWN_STATUS = frozenset({502, 503, 504})  # the worker is overloaded or down: leave it out for a while

def worker_failure(worker: Worker, phase: str, cooldown_s: float, exc: BaseException) -> Exception:
    """What a transport failure during ``phase`` is (``except TRANSPORT_ERRORS as exc: raise worker_failure(...)``):
    the gateway's own connection limit is Unavailable, an answer over its cap AnswerTooLarge, anything else
    UpstreamFailed with the worker cooled down. (A function an ``except`` calls, not a context manager: the
    success path, every request's, makes no call at all.)"""
    if isinstance(exc, PoolBusy):  # the gateway's own connection limit: the worker did nothing wrong
        return Unavailable("Every connection to the worker is in use; retry shortly.", "upstream_busy")
    if isinstance(exc, BodyTooLarge):  # what the request asked for, not a fault of the worker's
        return AnswerTooLarge(phase, describe(exc))
    if isinstance(exc, StateError):  # the gateway's own connection bookkeeping went wrong: the request fails,
        return UpstreamFailed(phase, describe(exc))  # the worker is not blamed
    reason = describe(exc)
    cool_down(worker, reason, cooldown_s)
    # connected, but the head never came: the worker failed before answering, it was not unreachable
    return UpstreamFailed("head" if phase == "connect" and not isinstance(exc, ConnectFailed) else phase, reason)
