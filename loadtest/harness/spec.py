"""Workload specs in YAML, validated once; a bad spec is an error naming the field."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Distribution(Strict):
    """A positive integer distribution: fixed, uniform, normal or lognormal (by mean and sd)."""

    dist: Literal["fixed", "uniform", "normal", "lognormal"] = "fixed"
    value: int | None = Field(None, ge=1)
    min: int | None = Field(None, ge=1)
    max: int | None = Field(None, ge=1)
    mean: float | None = Field(None, gt=0)
    sd: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _complete(self) -> Distribution:
        need = {"fixed": ("value",), "uniform": ("min", "max"), "normal": ("mean", "sd"),
                "lognormal": ("mean", "sd")}[self.dist]
        missing = [name for name in need if getattr(self, name) is None]
        if missing:
            raise ValueError(f"dist '{self.dist}' needs {', '.join(missing)}")
        if self.dist == "uniform" and self.min > self.max:  # type: ignore[operator]
            raise ValueError("min must not exceed max")
        return self

    def sample(self, rng: random.Random) -> int:
        if self.dist == "fixed":
            value: float = self.value  # type: ignore[assignment]
        elif self.dist == "uniform":
            value = rng.randint(self.min, self.max)  # type: ignore[arg-type]
        elif self.dist == "normal":
            value = rng.gauss(self.mean, self.sd)  # type: ignore[arg-type]
        else:  # lognormal with the given mean and sd of the value itself
            mean, sd = self.mean, self.sd or 0.0
            sigma2 = math.log(1 + (sd / mean) ** 2)  # type: ignore[operator]
            value = rng.lognormvariate(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))  # type: ignore[arg-type]
        low, high = self.min or 1, self.max or 1_000_000
        return int(min(max(round(value), low), high))


class SLO(Strict):
    ttft_ms: float | None = Field(None, gt=0)
    total_ms: float | None = Field(None, gt=0)


class RequestClass(Strict):
    name: str = Field(min_length=1)
    api_key: str = ""
    tier: Literal["premium", "standard", "batch"] = "standard"
    weight: float = Field(1.0, gt=0)
    model: str = Field(min_length=1)
    endpoint: Literal["chat", "completions"] = "chat"
    prompt_tokens: Distribution = Distribution(value=32)
    max_tokens: Distribution = Distribution(value=64)
    stream: bool = True
    ignore_eos: bool = True
    repeat_exact: float = Field(0.0, ge=0, le=1, description="share of requests repeating an earlier prompt")
    repeat_paraphrase: float = Field(0.0, ge=0, le=1, description="share rephrasing an earlier prompt")
    slo: SLO | None = None

    @model_validator(mode="after")
    def _shares(self) -> RequestClass:
        if self.repeat_exact + self.repeat_paraphrase > 1:
            raise ValueError("repeat_exact + repeat_paraphrase must not exceed 1")
        return self


class Closed(Strict):
    mode: Literal["closed"]
    concurrency: int = Field(ge=1, le=10_000)


class Open(Strict):
    mode: Literal["open"]
    rate: float = Field(gt=0, description="mean arrivals per second")
    process: Literal["poisson", "bursty"] = "poisson"
    burst_factor: float = Field(4.0, ge=1, description="bursty: rate multiplier while a burst is on")
    burst_s: float = Field(1.0, gt=0)
    max_inflight: int = Field(2048, ge=1, description="arrivals beyond this are counted as client overload")


class Ramp(Strict):
    rates: list[float] = Field(min_length=2)
    step_s: float = Field(gt=0)


class Spec(Strict):
    name: str = Field(min_length=1)
    target: str = "http://127.0.0.1:8080"
    targets: dict[str, str] | None = Field(None, description="compare mode: name -> URL, the first is the baseline")
    arrival: Annotated[Closed | Open, Field(discriminator="mode")]
    duration_s: float | None = Field(None, gt=0)
    requests: int | None = Field(None, ge=1)
    seed: int = 0
    words_seed: int | None = Field(None, description="the prompts' words drawn apart, from this seed (default: "
                                   "with the rest, from seed): runs with the same seed and other words seeds send "
                                   "the same sizes at the same moments, which miss an engine's prefix cache that "
                                   "the run before filled")
    timeout_s: float = Field(120.0, gt=0)
    corpus: str | None = Field(None, description="a text file to draw prompt words from; default: built-in words")
    classes: list[RequestClass] = Field(min_length=1)
    ramp: Ramp | None = None

    @model_validator(mode="after")
    def _bounded(self) -> Spec:
        if self.duration_s is None and self.requests is None:
            raise ValueError("set duration_s or requests (or both): a run must end by itself")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError("class names must be unique")
        return self


class SpecError(Exception):
    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("\n".join(f"{path}: {message}" for path, message in errors))


def parse_spec(text: str) -> Spec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([("<document>", f"invalid YAML: {exc}")]) from None
    if not isinstance(data, dict):
        raise SpecError([("<root>", "a spec is a mapping")])
    try:
        return Spec.model_validate(data)
    except ValidationError as exc:
        errors = []
        for e in exc.errors():
            loc = e["loc"]
            tags = {"closed", "open"} if loc[:1] == ("arrival",) else set()
            path = ".".join(str(p) for p in loc if str(p) not in tags and not str(p).startswith("function-"))
            errors.append((path or "<root>", e["msg"]))
        raise SpecError(errors) from None


def load_spec(path: str | Path) -> Spec:
    return parse_spec(Path(path).read_text())


def closed_spec(concurrency: int, stream: bool, max_tokens: int, seconds: float, key: str | None = None) -> Spec:
    """A closed loop of one class: 32-token prompts and fixed ``max_tokens`` to sim-llama-8b, as the ``bench``
    policy's tenant (the CPU-per-request benchmarks' workload: overhead, ab, processes, scheduler_cost)."""
    from loadtest.harness.fixtures import BENCH_KEY

    return Spec.model_validate({
        "name": "overhead", "arrival": {"mode": "closed", "concurrency": concurrency}, "duration_s": seconds,
        "classes": [{"name": "c", "api_key": key or BENCH_KEY, "model": "sim-llama-8b", "stream": stream,
                     "prompt_tokens": {"dist": "fixed", "value": 32},
                     "max_tokens": {"dist": "fixed", "value": max_tokens}}]})
