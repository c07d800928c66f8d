"""How a vLLM worker builds its engine, from the gateway config's ``workers.vllm`` section.

``model`` is a local shape built by the project (``tiny``, ``llama3-8b``: dummy weights, no download),
a directory, or a Hugging Face id. ``kv_tokens`` fixes the KV pool exactly (vLLM's block-count
override); without it vLLM sizes the pool from GPU memory. On CPU, vLLM needs the pool's size in
bytes up front, so it is computed from the model's shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fairgate.common.sections import validate_section
from fairgate.workers.engines.vllm.local_models import SHAPES, ensure_model

CPU_DEFAULT_KV_TOKENS = 8192


class VllmSettings(BaseModel):
    """The ``workers.vllm`` section: the engine each vLLM worker replica runs, and its OpenAI layer.
    ``cpu_threads`` only matters on CPU, where the engine shares the cores with its API layer, the
    gateway and everything else (unpinned runs steadier there)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, protected_namespaces=())

    model: str = Field("tiny", description="tiny, llama3-8b (dummy weights, built here), a directory or an HF id")
    load_format: str | None = Field(None, description="none: dummy for the project's own shapes, else vLLM's")
    dtype: str = Field("auto", description="vLLM's dtype")
    max_model_len: int | None = Field(None, ge=1, description="longest prompt + output (none: the model's)")
    kv_tokens: int | None = Field(None, ge=1, description="the KV pool exactly (none: from GPU memory)")
    block_size: int | None = Field(None, ge=1, description="KV block size (none: vLLM's)")
    max_num_seqs: int | None = Field(None, ge=1, description="vLLM's batch limit")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="share of GPU memory vLLM may take")
    enforce_eager: bool | None = Field(None, description="none: eager on CPU, compiled on GPU")
    cpu_threads: int | None = Field(
        None, ge=1, description="CPU kernel threads, unpinned (none: the process's, Ray gives 1, and vLLM's pinning)"
    )
    max_loras: int | None = Field(None, ge=1, description="LoRA adapters a batch holds at once (none: no adapters)")
    max_cpu_loras: int | None = Field(None, ge=1, description="LoRA adapters kept in host memory (none: vLLM's)")
    max_lora_rank: int = Field(16, ge=1, description="the largest adapter rank served")
    kv_events: bool = Field(
        True, description="forward vLLM's KV cache events to the dispatcher's prefix index (ZMQ on a Unix socket)"
    )
    extra_args: dict[str, Any] = Field(default_factory=dict, description="anything else, passed to AsyncEngineArgs")
    serve_args: list[str] = Field(
        default_factory=list,
        description="vLLM's OpenAI layer as on `vllm serve`'s command line, e.g. --enable-auto-tool-choice",
    )

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> VllmSettings:
        return validate_section(cls, raw, "workers.vllm")

    def cpu_environment(self) -> dict[str, str]:
        """The environment the engine's processes start with for ``cpu_threads``."""
        if not self.cpu_threads:
            return {}
        # unpinned threads set before start: the model worker can run in the engine core's process (see
        # ``engine_arg_values``), which vLLM's CPU platform allows only with its multiprocessing flag off
        return {
            "OMP_NUM_THREADS": str(self.cpu_threads),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        }

    def context_limit(self) -> int | None:
        """The longest prompt + output the engine will take, when known before it starts."""
        if self.max_model_len:
            return self.max_model_len
        if self.model not in SHAPES:
            return None
        longest = SHAPES[self.model]["max_position_embeddings"]
        return min(longest, self.kv_tokens) if self.kv_tokens else longest

    def model_path(self) -> str:
        return str(ensure_model(self.model)) if self.model in SHAPES else self.model

    def async_engine_args(self, served_model: str | None = None) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        return AsyncEngineArgs(**self.engine_arg_values(served_model))

    def serve_cli_args(self, served_model: str | None = None) -> list[str]:
        """``vllm serve``'s command line for exactly this engine and OpenAI layer (the worker builds its
        layer from it; benchmarks start vLLM's own server with it)."""
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        known = make_arg_parser(FlexibleArgumentParser())._option_string_actions
        args: list[str] = []
        for name, value in self.engine_arg_values(served_model).items():
            flag = "--" + name.replace("_", "-")
            if value is None:
                continue
            if isinstance(value, bool):
                negated = "--no-" + flag[2:]
                if value or negated in known:  # a false store_true flag is its default: left out
                    args.append(flag if value else negated)
            elif isinstance(value, dict | list):
                args += [flag, json.dumps(value)]
            else:
                args += [flag, str(value)]
        return ["--model", *args[args.index("--model") + 1 :][:1], *_without(args, "--model"), *self.serve_args]

    def engine_arg_values(self, served_model: str | None = None) -> dict[str, Any]:
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        path = self.model_path()
        args: dict[str, Any] = {
            "model": path,
            "tokenizer": path,
            "served_model_name": served_model or self.model,
            "load_format": self.load_format or ("dummy" if self.model in SHAPES else "auto"),
            "dtype": self.dtype,
            "disable_log_stats": False,  # the per-step stat logger is how reports learn of each step
            "enforce_eager": on_cpu if self.enforce_eager is None else self.enforce_eager,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }
        kv_tokens = self.kv_tokens or (CPU_DEFAULT_KV_TOKENS if on_cpu else None)
        block = self.block_size or (32 if on_cpu else 16)
        if self.block_size or kv_tokens:
            args["block_size"] = block
        if kv_tokens:
            blocks = -(-kv_tokens // block) + 1  # vLLM keeps one block aside
            args["num_gpu_blocks_override"] = blocks
            if on_cpu:
                args["kv_cache_memory_bytes"] = blocks * block * _kv_bytes_per_token(path) + (8 << 20)
            model_len = self.max_model_len or min(_max_position(path), kv_tokens)
            args["max_model_len"] = min(model_len, kv_tokens)
        elif self.max_model_len:
            args["max_model_len"] = self.max_model_len
        if self.max_num_seqs:
            args["max_num_seqs"] = self.max_num_seqs
        if self.max_loras:  # adapters are registered by the worker as tickets name them
            args |= {"enable_lora": True, "max_loras": self.max_loras, "max_lora_rank": self.max_lora_rank}
            if self.max_cpu_loras:
                args["max_cpu_loras"] = self.max_cpu_loras
        if on_cpu and self.cpu_threads:
            # one process for the engine core and its model worker, as on one GPU (vLLM's CPU platform
            # starts a worker process of its own to pin its threads; these are unpinned): a third fewer
            # processes to start, each importing torch and vLLM
            args["distributed_executor_backend"] = "uni"
        if on_cpu:
            # vLLM 0.32 on CPU: a seeded request whose prefill is split across steps kills the engine
            # ("CPU Generator does not use offset"), so prefills are never split there.
            args["enable_chunked_prefill"] = False
            args["max_num_batched_tokens"] = max(2048, args.get("max_model_len") or _max_position(path))
        args.update(self.extra_args)
        return args


def _without(args: list[str], flag: str) -> list[str]:
    i = args.index(flag)
    return args[:i] + args[i + 2 :]


def _hf_config(path: str) -> dict[str, Any]:
    config = Path(path) / "config.json"
    if config.exists():
        return json.loads(config.read_text())
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path).to_dict()


def _kv_bytes_per_token(path: str) -> int:
    c = _hf_config(path)
    heads = c.get("num_key_value_heads") or c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * heads * head_dim * 4  # K and V, 4 bytes: the widest dtype used


def _max_position(path: str) -> int:
    return int(_hf_config(path).get("max_position_embeddings", 4096))
