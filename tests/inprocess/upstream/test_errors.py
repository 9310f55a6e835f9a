"""The one map from transport failures to the gateway's errors: a worker that failed is cooled down and the
request ends in an UpstreamFailed that names no internals; the gateway's own connection limit blames no worker, nor
does an answer over its cap (what the request asked for)."""

from __future__ import annotations

import time

import pytest

from gateway.errors import AnswerTooLarge, Unavailable, UpstreamFailed
from gateway.fleet.worker import Learned, Observed, Worker
from gateway.outcomes import render
from gateway.transport.http1 import BodyTooLarge, ConnectFailed, Disconnected, PoolBusy, StateError
from gateway.upstream.errors import TRANSPORT_ERRORS, worker_failure

URL = "http://10.0.0.7:8000"


def worker() -> Worker:
    return Worker(URL, "main", observed=Observed(healthy=True), learned=Learned())


def failing(exc: BaseException, phase: str, w: Worker) -> BaseException:
    """What a step raises when ``exc`` comes out of the transport during ``phase`` (as the relay and dispatch
    write it)."""
    with pytest.raises(BaseException) as caught:
        try:
            raise exc
        except TRANSPORT_ERRORS as failure:
            raise worker_failure(w, phase, 5.0, failure) from None
    return caught.value


@pytest.mark.parametrize(("exc", "phase", "became", "code"), [
    (ConnectFailed("refused"), "connect", "connect", "upstream_unavailable"),
    (Disconnected("eof"), "connect", "head", "upstream_broken"),  # connected, then nothing came
    (TimeoutError(), "connect", "head", "upstream_broken"),
    (Disconnected("eof"), "stream", "stream", "upstream_stream_broken"),
])
def test_a_transport_failure_cools_the_worker_and_names_no_internals(exc: BaseException, phase: str, became: str,
                                                                     code: str) -> None:
    w = worker()
    raised = failing(exc, phase, w)
    assert isinstance(raised, UpstreamFailed) and (raised.phase, raised.code) == (became, code)
    assert raised.reason.startswith(type(exc).__name__), "the reason stays for the log line"
    assert not w.observed.healthy and w.observed.last_error == raised.reason
    assert w.observed.cooldown_until > time.monotonic() + 4
    _, _, body = render(raised)
    assert b"10.0.0.7" not in body and type(exc).__name__.encode() not in body


def test_the_gateways_own_connection_limit_blames_no_worker() -> None:
    w = worker()
    raised = failing(PoolBusy("every connection in use"), "connect", w)
    assert isinstance(raised, Unavailable) and raised.code == "upstream_busy"
    assert w.observed.healthy and w.observed.last_error is None


def test_an_answer_over_its_cap_blames_no_worker() -> None:
    w = worker()
    raised = failing(BodyTooLarge("the answer's body is over 65536 bytes"), "head", w)
    assert isinstance(raised, AnswerTooLarge) and raised.code == "answer_too_large"
    assert w.observed.healthy and w.observed.last_error is None


def test_the_gateways_own_state_bug_fails_the_request_and_blames_no_worker() -> None:
    w = worker()
    raised = failing(StateError("BODY -> IDLE is not a transition RFC 9112 allows"), "stream", w)
    assert isinstance(raised, UpstreamFailed) and raised.code == "upstream_stream_broken"
    assert w.observed.healthy and w.observed.last_error is None


def test_anything_else_passes_through_untouched() -> None:
    w = worker()
    bug = KeyError("a bug is not the worker's failure")
    assert failing(bug, "head", w) is bug and w.observed.healthy
