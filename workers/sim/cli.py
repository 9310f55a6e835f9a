"""`tollgate sim`: start a simulated vLLM worker."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Sequence
from typing import cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from workers.sim.engine import EngineConfig
from workers.sim.server import METRICS_FAULTS, RUNNERS, Faults, SimServer

_DEFAULTS = EngineConfig()


def _bounded(kind: Callable[[str], float], low: float, high: float | None = None) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {kind.__name__}") from None
        if value < low or (high is not None and value > high):
            upper = f" and <= {high}" if high is not None else ""
            raise argparse.ArgumentTypeError(f"{value} must be >= {low}{upper}")
        return value
    parse.__name__ = kind.__name__
    return parse


def _statuses(text: str) -> tuple[int, ...]:
    try:
        codes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of status codes") from None
    if not all(400 <= c <= 599 for c in codes):
        raise argparse.ArgumentTypeError("status codes must be between 400 and 599")
    return codes


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="tollgate sim", description=__doc__)
    d = _DEFAULTS
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_bounded(int, 0, 65535), default=8100)
    p.add_argument("--model", default="sim-llama-8b", help="served model name")
    p.add_argument("--runner", choices=RUNNERS, default="generate",
                   help="generate (chat and completions) or pooling (embeddings), as vLLM's --runner")
    engine = p.add_argument_group("engine (defaults: Llama-3-8B bf16 on one A100-80GB)")
    engine.add_argument("--max-num-seqs", type=_bounded(int, 1), default=d.max_num_seqs)
    engine.add_argument("--num-blocks", type=_bounded(int, 1), default=d.num_blocks,
                        help="KV-cache blocks of --block-size tokens")
    engine.add_argument("--block-size", type=_bounded(int, 1), default=d.block_size)
    engine.add_argument("--max-num-batched-tokens", type=_bounded(int, 1), default=d.max_num_batched_tokens)
    engine.add_argument("--max-model-len", type=_bounded(int, 2), default=d.max_model_len)
    engine.add_argument("--decode-base-ms", type=_bounded(float, 0), default=d.decode_base_s * 1e3,
                        help="fixed cost of one decode step")
    engine.add_argument("--decode-per-seq-ms", type=_bounded(float, 0), default=d.decode_per_seq_s * 1e3,
                        help="added step cost per sequence in the batch")
    engine.add_argument("--prefill-per-token-ms", type=_bounded(float, 0), default=d.prefill_per_token_s * 1e3)
    engine.add_argument("--zero-delay", action="store_true", help="all step costs 0: measure the server itself")
    engine.add_argument("--jitter", type=_bounded(float, 0, 1), default=0.0, help="relative stddev of step time")
    engine.add_argument("--seed", type=int, default=0)
    engine.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs")
    engine.add_argument("--mean-output-tokens", type=_bounded(int, 0), default=d.mean_output_tokens,
                        help="mean answer length before EOS (answers end with finish_reason stop); 0 = every "
                             "answer runs to max_tokens (the benchmarks' exact lengths)")
    engine.add_argument("--max-logprobs", type=_bounded(int, -1), default=d.max_logprobs,
                        help="as vLLM's: the most logprobs (and prompt logprobs) a request may ask for, a 400 above "
                             "it; -1 = the vocabulary")
    faults = p.add_argument_group("failure injection")
    faults.add_argument("--error-rate", type=_bounded(float, 0, 1), default=0.0)
    faults.add_argument("--error-status", type=_statuses, default=(500,), help="e.g. 500,503")
    faults.add_argument("--hang-after", type=_bounded(int, 0), default=None, help="stall streams after N tokens")
    faults.add_argument("--drop-after", type=_bounded(int, 0), default=None,
                        help="drop the connection after N streamed tokens")
    faults.add_argument("--slow-start", type=_bounded(float, 0), default=0.0, help="/health answers 503 for N s")
    faults.add_argument("--metrics", choices=METRICS_FAULTS, default="ok",
                        help="/metrics: ok, missing (404, an engine without vLLM's metrics), hang, or huge (50 MB)")
    return p


def config_from_args(args: argparse.Namespace) -> tuple[EngineConfig, Faults]:
    zero = args.zero_delay
    config = EngineConfig(
        max_num_seqs=int(args.max_num_seqs), num_blocks=int(args.num_blocks), block_size=int(args.block_size),
        max_num_batched_tokens=int(args.max_num_batched_tokens), max_model_len=int(args.max_model_len),
        decode_base_s=0.0 if zero else args.decode_base_ms / 1e3,
        decode_per_seq_s=0.0 if zero else args.decode_per_seq_ms / 1e3,
        prefill_per_token_s=0.0 if zero else args.prefill_per_token_ms / 1e3,
        jitter=args.jitter, seed=args.seed, scheduling_policy=args.scheduling_policy,
        mean_output_tokens=int(args.mean_output_tokens), max_logprobs=int(args.max_logprobs),
    )
    faults = Faults(error_rate=args.error_rate, error_statuses=args.error_status,
                    hang_after=None if args.hang_after is None else int(args.hang_after),
                    drop_after=None if args.drop_after is None else int(args.drop_after),
                    ready_at=time.monotonic() + args.slow_start, metrics=args.metrics)
    return config, faults


def serve(server: SimServer, host: str, port: int) -> None:
    """Run on uvloop + httptools, counting accepted TCP connections (tests prove keep-alive with it)."""
    counter = server.metrics.connections

    class CountingProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            counter.inc()
            super().connection_made(cast(asyncio.Transport, transport))  # a stream server's connection

    config = uvicorn.Config(server.app, host=host, port=port, loop="uvloop", http=CountingProtocol,
                            lifespan="on", log_level="warning", access_log=False, timeout_keep_alive=75)
    uvicorn.Server(config).run()


def main(argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None) -> None:
    args = build_parser(parser).parse_args(argv)
    run(args)


def run(args: argparse.Namespace) -> None:
    config, faults = config_from_args(args)
    if config.max_num_batched_tokens < config.max_num_seqs:
        raise SystemExit("tollgate sim: --max-num-batched-tokens must be >= --max-num-seqs")
    serve(SimServer(config, args.model, faults, args.runner), args.host, int(args.port))
