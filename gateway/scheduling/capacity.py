"""How much work a pool can start now, from the gateway's own counts and fresh vLLM metrics.

A worker takes new work only while it is healthy, its metrics are fresh, its KV cache is below the
threshold and the gateway holds fewer of its requests than it can run: the backlog then stays in the
gateway's queues, where the order is the gateway's (premium first), instead of inside the engine, where
every tier waits alike.

Each worker's concurrency is learned from its metrics rather than trusted from configuration: when requests
wait inside the engine, the number it runs is what it can run (vLLM's max_num_seqs, or fewer when the KV
cache is the limit), and the limit drops to it; while the engine keeps up near the limit, the limit probes
upwards (doubling until the engine first shows its limit, then by a quarter), up to the pool's
max_inflight_per_worker. It starts at START_LIMIT, not the ceiling.

An engine whose metrics say nothing (no /metrics, one that hangs or is malformed, names the gateway does not
know, or a reading older than ``stale_after_s``) is not held to what it last showed: its limit then comes from
the requests it answers (``answered``, ``failed``), as a TCP window or Netflix's concurrency-limits would learn
it. Each answer whose engine-side latency (TTFT without the gateway's queue wait; per output token for a whole answer)
stays within twice the least seen, plus 50 ms, raises the limit (by two per answer until the first congestion,
then by one per limit's worth of answers) while the limit is in use and none of the last eight answers was
slow; two slow ones among the last eight lower it by a tenth (one alone is as likely this host's busy moment),
a worker failure halves it; never below what the engine held through eight answers in a row uncongested,
and never below the last limit its metrics showed. While a limit is still growing, the queue does not refuse
on its forecast (``still_learning``). So a healthy engine is never
throttled by a missing signal.

Why each rule below, with what it was measured against: docs/decisions/003-scheduler-fairness.md ("Capacity
learning").
"""

from __future__ import annotations

import collections

from gateway.fleet.worker import Worker
from gateway.policy.schema import Pool, SchedulingPolicy
from gateway.state.replicas import ALONE, Share

# A worker's concurrency before anything is learned: start low and probe up (by a quarter a read while the
# engine keeps up), rather than at the ceiling, where a first burst of batch lines went straight into the engines'
# own queues and premium waited behind them.
START_LIMIT = 8
# After the engine showed its limit (requests waiting), do not probe above it for this many reads (~30 s at the
# default scrape interval): probing straight back up put a request in the engine's own queue every other read,
# where a newly arrived request of any tenant or class waited behind it.
HOLD_READS = 60
# An engine that queues requests while at least half its KV cache is free is held by its sequence cap (vLLM's
# max_num_seqs), not by memory: that limit does not move with the requests' sizes, and each probe above it puts
# a request in the engine's queue for a whole answer's time. It is held ten times longer (~5 min), not forever:
# a limit read low under churn still recovers.
SEQUENCE_BOUND_KV = 0.5
SEQUENCE_HOLD_READS = 10 * HOLD_READS




def learn(worker: Worker, ceiling: int, wanted: bool = False) -> None:
    """Update the worker's learned concurrency after a metrics read.

    ``wanted``: the gateway holds requests for this pool in its queue. Until the engine has shown its limit,
    the limit then grows while the engine runs what it was given without queueing, even below 90% of the limit
    (the premium reserve keeps the other classes under it, and they are the ones waiting). Once the limit is
    known, probing above it puts requests in the engine's own queue, so only the 90% rule applies.

    A request that arrived just before the scrape shows as waiting for one engine step even when the engine
    has room, so only two reads in a row with requests waiting lower the limit, and to the most the engine
    ran in its last eight reads, not at this one. A read at which the engine has not stepped since the one
    before (its generated-token counter has not moved: one long prefill step, read twice) teaches nothing and
    is skipped; an engine that reports no counter is taken to step between reads. Under churn (short requests
    finishing and new ones arriving between steps) a read often catches a slot in passing, and trusting it
    shrank the limit below what the engine runs. Nor while what it runs still moves (_at_plateau). Why each,
    measured: docs/decisions/003-scheduler-fairness.md."""
    learned, observed = worker.learned, worker.observed
    if observed.metrics_error is not None:
        return  # nothing new was read
    if observed.generated and observed.generated == learned.generated_read:
        return  # the engine has not stepped since the last read (a long prefill): the same moment, read again
    learned.generated_read = observed.generated
    current = learned.limit or min(ceiling, START_LIMIT)
    learned.recent_running.append(observed.running)
    if observed.waiting > 0:
        if learned.queued_reads and _at_plateau(learned.recent_running):
            current = max(1, int(max(learned.recent_running)))
            learned.hold_reads = SEQUENCE_HOLD_READS if observed.kv_usage <= SEQUENCE_BOUND_KV else HOLD_READS
            learned.limit_found = True
        learned.queued_reads += 1
    else:
        learned.queued_reads = 0
        if learned.hold_reads:
            learned.hold_reads -= 1
        elif _in_use(worker, current) and (observed.running >= 0.9 * current or (
                wanted and not learned.limit_found and observed.running >= 0.9 * worker.inflight > 0)):
            # doubling until the engine first shows its limit (a burst on a fresh worker is not held back for
            # long), then a quarter at a time
            current = current + (current if not learned.limit_found else max(1, current // 4))
    learned.limit = min(ceiling, current)
    # the request stream's learner goes on from here if the metrics fall silent (never from a guess of its own
    # made while the metrics held the limit: it would grow past what the engine runs, unseen)
    learned.stream_limit = float(learned.limit)
    learned.slow_start = not learned.limit_found


def _in_use(worker: Worker, limit: int) -> bool:
    """Is this process's limit for the worker the one its requests are held to? Not when the processes agreed
    on a lower one (another replica learned less): the engine's reads then say nothing about this limit, and
    the engine's running counts the other replicas' requests too, so this one would grow on every read while
    it had a request queued, to the ceiling. Why: docs/decisions/003-scheduler-fairness.md."""
    return not worker.agreed.limit or limit <= worker.agreed.limit


def _at_plateau(running: collections.deque[float]) -> bool:
    """Does the engine run as many as at the read before, and as many as at any of the recent reads? An engine
    at its cap runs its cap at every read; one whose load is climbing (a ramp the gateway paces, or a burst
    arriving over several steps) shows arrivals waiting for the next step at most reads: read as its cap, each
    such pair would lower the limit to the ramp's level of the moment and hold it there for minutes.
    Why: docs/decisions/003-scheduler-fairness.md."""
    return len(running) < 2 or running[-1] == running[-2] == max(running)


def worker_slots(worker: Worker, spec: Pool, scheduling: SchedulingPolicy, now: float,
                 share: Share = ALONE) -> int:
    """How many of this process's requests the worker may hold now (those it holds already included).

    Each gateway process takes its ``share`` of the worker's limit, so N processes together never hand it
    more than it runs."""
    if not worker.available(now):
        return 0
    observed, learned = worker.observed, worker.learned
    if now - observed.scraped_at <= scheduling.stale_after_s:
        if observed.kv_usage >= scheduling.kv_saturation:
            return worker.inflight  # nearly out of KV cache: nothing new until it reports room
        # A worker that queued requests at its last scrape has had its limit lowered to what it runs (learn());
        # from there the gateway's own in-flight count, fresher than any scrape, says when a slot is free.
        limit = learned.limit or min(spec.max_inflight_per_worker, START_LIMIT)
    else:  # its metrics say nothing now: what its answers show, never less than its last reading
        limit = max(int(learned.stream_limit) or min(spec.max_inflight_per_worker, START_LIMIT), learned.limit)
    part = share.of_limit(min(limit, worker.agreed.limit) if worker.agreed.limit else limit)
    return max(0, part - worker.agreed.excess)  # others still over their parts: leave it to them to drain


# The request stream's signal (``finished``)
TOLERANCE = 2.0  # an answer within this many times the least latency seen (plus SLACK_S) is uncongested
SLACK_S = 0.05
DRIFT = 0.01  # how fast what was learned drifts: the least latency up to what the engine answers in now, and the
# concurrency shown without a queue down (by this much an answer while none of the recent ones queued)
BACK_OFF = 0.9  # a congested answer lowers the limit by a tenth; a failed worker halves it
SLOW_START_STEP = 2.0
SLOW_OF_RECENT = 2  # congested answers among the last eight before the limit comes down


def answered(worker: Worker, ceiling: int, held: int, latency: float, whole: bool = False) -> None:
    """Learn from one answer of ``worker``: its engine-side latency (a stream's TTFT without the gateway's
    queue wait, read at the first token; for a whole answer, per output token, read at its end), with ``held``
    requests on the worker as it came (itself included)."""
    learned = worker.learned
    limit = learned.stream_limit or float(min(ceiling, START_LIMIT))
    if whole:
        learned.per_token_floor, uncongested = _within(learned.per_token_floor, latency)
    else:
        learned.ttft_floor, uncongested = _within(learned.ttft_floor, latency)
    recent = learned.recent_slow
    recent.append(not uncongested)
    slow = sum(recent)
    if not uncongested and slow < SLOW_OF_RECENT:
        return  # one slow answer may be a busy moment of this host, not a queue in the engine
    if uncongested:
        if not slow and len(recent) == recent.maxlen:  # a run of answers with no queue at this many held
            learned.demonstrated = max(float(held), learned.demonstrated - DRIFT)
        if slow:
            pass  # some of the last answers queued in the engine: hold here
        elif held >= limit / 2:  # the limit is in use: there is something to learn about more
            # slow start: two more per answer, so the limit still doubles each round when the classes below
            # premium may use only part of it (premium_reserve), and so only part of it answers
            limit += SLOW_START_STEP if learned.slow_start else 1.0 / limit
    else:
        learned.slow_start = False
        limit = max(limit * BACK_OFF, learned.demonstrated, 1.0)
    learned.stream_limit = min(float(ceiling), limit)


def failed(worker: Worker, ceiling: int) -> None:
    """The worker failed a request (connection lost, 5xx, silence): halve what the stream taught."""
    learned = worker.learned
    learned.stream_limit = max(1.0, (learned.stream_limit or float(min(ceiling, START_LIMIT))) / 2)
    learned.slow_start = False


def _within(floor: float, latency: float) -> tuple[float, bool]:
    """The floor moved by this latency (down at once, up slowly), and whether the latency was uncongested."""
    floor = latency if floor == 0 or latency < floor else floor + DRIFT * (latency - floor)
    return floor, latency <= floor * TOLERANCE + SLACK_S


def still_learning(worker: Worker, now: float, scheduling: SchedulingPolicy) -> bool:
    """Is the worker's limit still growing towards what it can run (it has not shown its limit yet)?"""
    if not worker.available(now):
        return False
    if now - worker.observed.scraped_at <= scheduling.stale_after_s:
        return not worker.learned.limit_found
    return worker.learned.slow_start


def capacity(workers: list[Worker], spec: Pool, scheduling: SchedulingPolicy, now: float,
             share: Share = ALONE) -> int:
    return sum(worker_slots(w, spec, scheduling, now, share) for w in workers)
