"""Does real vLLM on this CPU stream? (python -m loadtest run vllm_stream)

Starts the tiny-model vLLM CPU server once per OpenMP binding (``VLLM_CPU_OMP_THREADS_BIND``) and sends streamed
answers back to back, straight to it, one at a time. Per binding: when the response head came, whether the stream
arrived whole (its first event after 90% of the answer's time: nothing to relay as it is written), and the tokens
per second. The suite's engines take the binding this shows to stream (``workers.vllm.cpu.start_vllm_cpu``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import httpx

from workers.vllm.cpu import start_vllm_cpu


def one_stream(url: str, tokens: int, n: int) -> tuple[float, float, float]:
    """(seconds to the response head, seconds to the first event, seconds to the end)."""
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": f"hello {n}"}], "max_tokens": tokens,
            "stream": True, "ignore_eos": True}
    sent = time.monotonic()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as response:
        head = time.monotonic() - sent
        first = None
        for chunk in response.iter_raw():
            if first is None and b"data: " in chunk:
                first = time.monotonic() - sent
    return head, first if first is not None else head, time.monotonic() - sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binds", default="auto,nobind")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=400)
    args = parser.parse_args()
    for bind in args.binds.split(","):
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
        server = start_vllm_cpu(max_model_len=2048)
        try:
            runs = [one_stream(server.url, args.tokens, n) for n in range(args.streams)]
        finally:
            server.stop()
        whole = sum(first > 0.9 * end for _, first, end in runs)
        heads = sorted(head for head, _, _ in runs)
        rates = [args.tokens / end for _, _, end in runs]
        print(f"{bind:>7}: {whole}/{len(runs)} arrived whole; head p50 {statistics.median(heads) * 1000:.0f} ms, "
              f"max {heads[-1] * 1000:.0f} ms; {min(rates):.0f}-{max(rates):.0f} tokens/s "
              f"(median {statistics.median(rates):.0f})", flush=True)


if __name__ == "__main__":
    main()
