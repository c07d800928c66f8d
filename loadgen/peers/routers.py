"""The peers: routers a platform team would put in front of its engines instead of fairgate, each
started as its documentation recommends (docs/peers.md states the configurations), as a process of its
own on loopback.

- ``sglang-router``: SGLang's Rust router, its default and recommended ``cache_aware`` policy (a radix
  tree of what each worker served, falling back to the least loaded worker when load is uneven).
- ``vllm-router``: vLLM's Rust router (a fork of SGLang's), its default ``cache_aware`` policy.
- ``ray-serve-llm``: Ray Serve LLM's prefix-aware request router (``fairgate.loadgen.peers.ray_serve_llm``).
- ``litellm``: the LiteLLM proxy, each engine a ``hosted_vllm`` deployment (its provider for vLLM's
  server), ``simple-shuffle`` routing (its recommended strategy for speed), every tenant at one
  priority. Its per-key limits need its Postgres key store, which a bench on loopback does not run.

The Rust routers and what Ray Serve LLM's router imports (pyarrow) come with the ``peers`` extra.
LiteLLM's proxy pins packages fairgate's environment does not share (``rich<14``): it is looked up on
PATH, beside this interpreter, or in ``.venv-litellm`` (``scripts/setup_peers.sh`` makes it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from fairgate.common.processes import stop_group
from fairgate.loadgen.serve_process import LAUNCH_ENVIRONMENT, free_port, wait_for_completion

REPOSITORY = Path(__file__).resolve().parents[2]


class PeerMissing(RuntimeError):
    """A peer's program is not installed; the message says how to install it."""


@dataclass(frozen=True)
class Peer:
    """How to start one instance of a peer in front of ``backends`` (base URLs without ``/v1``)."""

    name: str
    configuration: str  # as the docs' table states it
    program: Callable[[], list[str]]  # the program to run; raises PeerMissing when it is not installed
    arguments: Callable[[Sequence[str], int, Path, str, str], list[str]]  # backends, port, scratch, model, key

    def installed(self) -> bool:
        try:
            self.program()
        except PeerMissing:
            return False
        return True


def _sglang_program() -> list[str]:
    if importlib.util.find_spec("sglang_router") is None:
        raise PeerMissing("sglang-router is not installed (pip install -e '.[peers]')")
    return [sys.executable, "-m", "sglang_router.launch_router"]


def _ray_serve_llm_program() -> list[str]:
    if importlib.util.find_spec("pyarrow") is None:  # ray.serve.llm imports it
        raise PeerMissing("Ray Serve LLM's router needs pyarrow (pip install -e '.[peers]')")
    return [sys.executable, "-m", "fairgate.loadgen.peers.ray_serve_llm"]


def _ray_serve_llm_arguments(backends: Sequence[str], port: int, _scratch: Path, _model: str, _key: str) -> list[str]:
    return ["--port", str(port), "--backends", *backends]


def _rust_router_arguments(backends: Sequence[str], port: int, _scratch: Path, _model: str, _key: str) -> list[str]:
    return [
        *["--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware"],
        *["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
        *["--worker-urls", *backends],
    ]


def _litellm_arguments(backends: Sequence[str], port: int, scratch: Path, model: str, key: str) -> list[str]:
    config = {
        "model_list": [
            {
                "model_name": model,
                "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": f"{b}/v1", "api_key": "none"},
            }
            for b in backends
        ],
        "router_settings": {"routing_strategy": "simple-shuffle"},
        "litellm_settings": {"request_timeout": 600, "num_retries": 0},
        "general_settings": {"master_key": key},  # every tenant's key: virtual keys need its Postgres store
    }
    path = scratch / f"litellm-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    return ["--config", str(path), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]


def _program(name: str, install: str, *more: Path) -> list[str]:
    """The program ``name`` on PATH, beside this interpreter, or in ``more``."""
    for where in (None, Path(sys.executable).parent, *more):
        found = shutil.which(name, path=None if where is None else str(where))
        if found:
            return [found]
    raise PeerMissing(f"{name} is not installed ({install})")


PEERS = {
    p.name: p
    for p in (
        Peer("sglang-router", "cache_aware (its default)", _sglang_program, _rust_router_arguments),
        Peer(
            "vllm-router",
            "cache_aware (its default)",
            lambda: _program("vllm-router", "pip install -e '.[peers]'"),
            _rust_router_arguments,
        ),
        Peer(
            "ray-serve-llm",
            "PrefixCacheAffinityRouter (its defaults), one Serve replica per engine relaying to it",
            _ray_serve_llm_program,
            _ray_serve_llm_arguments,
        ),
        Peer(
            "litellm",
            "simple-shuffle, every tenant at one priority, no per-key limits (they need its Postgres store)",
            lambda: _program("litellm", "bash scripts/setup_peers.sh", REPOSITORY / ".venv-litellm" / "bin"),
            _litellm_arguments,
        ),
    )
}


@contextlib.contextmanager
def peer_instance(
    peer: Peer, backends: Sequence[str], port: int, scratch: Path, model: str, key: str, log: Path | None = None
) -> Iterator[tuple[str, int]]:
    """One instance of ``peer`` on 127.0.0.1:``port``, taking API key ``key`` where it checks keys, until
    the block ends, once a completion came back through it; yields (its base URL, its process id)."""
    command = [*peer.program(), *peer.arguments(backends, port, scratch, model, key)]
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    env = {**LAUNCH_ENVIRONMENT, "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "NO_COLOR": "1"}
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, process_group=0)
    try:
        base = f"http://127.0.0.1:{port}/v1"
        wait_for_completion(base, model, key, proc, timeout_s=180.0)
        yield base, proc.pid
    finally:
        stop_group(proc)
        if log is not None:
            out.close()  # type: ignore[union-attr]
