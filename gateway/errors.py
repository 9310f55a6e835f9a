"""What the gateway's core says when it will not or cannot answer: named outcomes, no HTTP.

Each step raises one of these; ``gateway.outcomes`` is the one place that turns them into a
status, headers and OpenAI's error JSON, and the batch runner reads the same outcomes to decide whether a
line waits and tries again (``TryLater``) or ends. The core never picks a status code or writes a header:
as in the Gateway API Inference Extension's flow controller (``ErrRejected``, ``ErrQueueAtCapacity``,
``ErrTTLExpired``), an outcome is a kind and a reason. ``code`` is the stable name clients, logs and metrics
see; ``message`` is for people.
"""

from __future__ import annotations


class GatewayError(Exception):
    """A request that ends without an answer from a worker. Subclasses name why."""

    code = "internal_error"
    details: list[dict[str, str]] | None = None  # itemised causes (a rejected policy's errors by path)

    def __init__(self, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param


class InvalidRequest(GatewayError):
    """The request itself is wrong: resending it unchanged cannot succeed."""

    code = "invalid_value"


class TooLarge(InvalidRequest):
    """The request body (or an upload) is over its size limit."""

    code = "request_too_large"


class NotAuthenticated(GatewayError):
    """No credential, or one the policy does not know."""

    code = "invalid_api_key"


class KeyRevoked(NotAuthenticated):
    """Work submitted under a key that is no longer live (revoked, expired, its tenant gone): a batch's lines."""

    code = "key_revoked"


class NotPermitted(GatewayError):
    """A known caller asking for something its role or tenant may not have."""

    code = "forbidden"


class NotFound(GatewayError):
    """No such model, file, batch or route, or one that belongs to another tenant."""

    code = "not_found"


class Conflict(GatewayError):
    """The request does not fit the state of what it names (a finished batch cancelled, a feature off)."""

    code = "conflict"


class ClientGone(GatewayError):
    """The client left before the answer was complete."""

    code = "client_disconnected"


class TryLater(GatewayError):
    """Refused for now; the same request may succeed after ``retry_after_s`` seconds."""

    code = "try_later"

    def __init__(self, message: str, code: str | None = None, retry_after_s: float = 1.0,
                 param: str | None = None) -> None:
        super().__init__(message, code, param)
        self.retry_after_s = retry_after_s


class Shed(TryLater):
    """The scheduler turned the request away: its class's queue is full, or it would (or did) wait past its
    deadline. ``reason`` is the metric's label: predicted_wait | deadline | queue_full | displaced."""

    code = "queue_overloaded"

    def __init__(self, message: str, service_class: str, reason: str, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.service_class = service_class
        self.reason = reason


class RateLimited(TryLater):
    """The tenant's requests or tokens per minute are used up until the window moves. ``headers``: the
    x-ratelimit-* headers of the limits, as a success carries them."""

    code = "rate_limit_exceeded"

    def __init__(self, message: str, retry_after_s: float, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.headers = headers or []


class TenantBusy(TryLater):
    """The tenant already has its most requests in flight."""

    code = "tenant_concurrency_exceeded"


class Unavailable(TryLater):
    """A part the request needs is down right now: no healthy worker, the batch or ledger store."""

    code = "upstream_unavailable"


class QuotaExceeded(GatewayError):
    """The tenant keeps as many files, or bytes of them, as it may: delete some (or wait for them to expire)."""

    code = "file_quota_exceeded"


class OverBudget(GatewayError):
    """The tenant's budget for the period cannot cover this request's worst case. Not ``TryLater``: it does
    not pass until the period turns or the budget grows, so a batch line ends instead of retrying."""

    code = "insufficient_quota"


class UpstreamFailed(GatewayError):
    """A worker failed during ``phase`` (connect | head | stream); ``reason`` is for logs, never for clients."""

    _MESSAGES = {
        "connect": "No worker could take the request.",
        "head": "The worker failed before answering.",
        "stream": "The worker failed mid-stream; the answer is incomplete.",
    }
    _CODES = {"connect": "upstream_unavailable", "head": "upstream_broken", "stream": "upstream_stream_broken"}

    def __init__(self, phase: str, reason: str) -> None:
        super().__init__(self._MESSAGES[phase], self._CODES[phase])
        self.phase = phase
        self.reason = reason


class AnswerTooLarge(UpstreamFailed):
    """The worker's answer was larger than the gateway relays (the pool's ``max_answer_bytes``). Never retried
    on another worker (it would make the same answer again), never the worker's fault (no cooldown), and billed
    at the request's completion bound: the engine generated it, whatever the client got."""

    def __init__(self, phase: str, reason: str) -> None:
        GatewayError.__init__(self, "The answer was larger than this gateway relays in one answer; lower n, "
                              "max_tokens or the number of log-probabilities.", "answer_too_large")
        self.phase = phase
        self.reason = reason


class WorkerRejected(InvalidRequest):
    """A worker refused the request as invalid (a 4xx with its own message): the client's error, in the
    worker's words. ``worker_status`` is what the worker answered."""

    def __init__(self, message: str, worker_status: int) -> None:
        super().__init__(message, f"upstream_{worker_status}")
        self.worker_status = worker_status
