"""Render the `vllm serve` command line (and container args) from a worker spec in the policy."""

from __future__ import annotations

import json
import shlex

from gateway.policy.schema import WorkerSpec


def vllm_args(spec: WorkerSpec) -> list[str]:
    """Arguments after `vllm serve`: the model first, then only what the spec sets or vLLM defaults differently."""
    args = [spec.model, "--host", "0.0.0.0", "--port", str(spec.port)]
    if spec.served_name:
        args += ["--served-model-name", spec.served_name]
    args += ["--gpu-memory-utilization", f"{spec.gpu_memory_utilization:g}"]
    for flag, value in (("--max-num-seqs", spec.max_num_seqs),
                        ("--max-num-batched-tokens", spec.max_num_batched_tokens),
                        ("--max-model-len", spec.max_model_len), ("--quantization", spec.quantization)):
        if value is not None:
            args += [flag, str(value)]
    args.append("--enable-prefix-caching" if spec.enable_prefix_caching else "--no-enable-prefix-caching")
    if spec.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", spec.kv_cache_dtype]
    if spec.speculative_config is not None:
        args += ["--speculative-config", json.dumps(spec.speculative_config, separators=(",", ":"), sort_keys=True)]
    args += ["--scheduling-policy", spec.scheduling_policy]
    if spec.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
    if spec.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(spec.pipeline_parallel_size)]
    return args


def shell_command(spec: WorkerSpec) -> str:
    return shlex.join(["vllm", "serve", *vllm_args(spec)])


def container_args(spec: WorkerSpec) -> dict[str, object]:
    """The `command`/`args` pair for a Kubernetes container running the vllm/vllm-openai image."""
    return {"command": ["vllm", "serve"], "args": vllm_args(spec)}
