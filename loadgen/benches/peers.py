"""``fairgate bench peers``: fairgate against other routers on the same engines and traffic. The bench
itself is the ``fairgate.loadgen.peers`` package (its engines served alone, each peer started as its
users start it, the workloads, the report and its plots); this module is its options and its run.
The package is imported when the bench runs: its peers' clients are heavy to import."""

from __future__ import annotations

import json
from pathlib import Path

from fairgate.core.registry import Param
from fairgate.loadgen.benches.base import Bench, Figures, Options, names, register
from fairgate.workers.engines import engine_names


@register
class PeersBench(Bench):
    """fairgate against SGLang's and vLLM's routers, Ray Serve LLM and LiteLLM on shared engines."""

    name = "peers"
    help = "fairgate against other routers on the same engines and traffic"
    params = (
        Param("workloads", str, "overload,on_off,real,mooncake,skew", "comma-separated"),
        Param("peers", str, "sglang-router,vllm-router,ray-serve-llm,litellm", "comma-separated"),
        Param("engine", str, "simulated", "vllm: a small variant on CPU"),
        Param("engines", int, 2, "engines behind every arm"),
        Param("model", str, "", "vLLM model (default tiny)"),
        Param("kv_tokens", int, 0, "each engine's KV pool (0: simulated 10,000, vLLM 8192)"),
        Param("dtype", str, "", "vLLM's dtype (e.g. float32 where bfloat16 kernels fail)"),
        Param("seconds", float, 40.0, "of each workload, per pass"),
        Param("rounds", int, 2, "passes of each arm, the others paused (medians)"),
        Param("out", str, "out/peers", "where the JSON and a plot per workload go"),
        Param("log_dir", str, "", "keep every server's log here"),
        Param("controls", bool, False, "also fairgate in arrival order (fcfs): the gateway's own cost apart"),
    )

    def check(self, options: Options) -> None:
        from fairgate.loadgen.peers.routers import PEERS
        from fairgate.loadgen.peers.workloads import NAMES

        names(options["workloads"], "--workloads", NAMES)
        peers = names(options["peers"], "--peers", PEERS)
        missing = [p for p in peers if not PEERS[p].installed()]
        if missing:
            raise ValueError(f"not installed: {', '.join(missing)} (bash scripts/setup_peers.sh installs every peer)")
        if options["engine"] not in engine_names():
            raise ValueError(f"--engine: one of {', '.join(engine_names())}")
        if options["engines"] < 1 or options["rounds"] < 1 or options["seconds"] <= 0 or options["kv_tokens"] < 0:
            raise ValueError("--engines, --rounds and --seconds must be positive, --kv-tokens at least 0")

    def run(self, options: Options) -> Figures:
        from fairgate.loadgen.peers.bench import PeersBenchConfig, bench_peers
        from fairgate.loadgen.peers.report import plot_peers
        from fairgate.loadgen.peers.routers import PEERS
        from fairgate.loadgen.peers.workloads import NAMES
        from fairgate.workers.engines import engine_for

        o = options
        workloads, peers = names(o["workloads"], "--workloads", NAMES), names(o["peers"], "--peers", PEERS)
        config = PeersBenchConfig(
            o["engine"], o["engines"], o["seconds"], o["rounds"], workloads, peers, controls=o["controls"]
        )
        if o["engine"] != PeersBenchConfig.engine:  # another engine than the default's: its benchmark settings
            given = {"model": o["model"] or None, "kv_tokens": o["kv_tokens"] or None, "cpu_threads": 1}
            config.settings, config.model = engine_for(o["engine"]).benchmark_settings(given | {"dtype": o["dtype"]})
        elif o["kv_tokens"]:
            config.settings = {**config.settings, "kv_tokens": o["kv_tokens"]}
        log_dir = Path(o["log_dir"]) if o["log_dir"] else None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        out = bench_peers(config, log_dir)
        where = Path(o["out"])
        where.mkdir(parents=True, exist_ok=True)
        (where / "peers.json").write_text(json.dumps(out, indent=1))
        for name, w in out["workloads"].items():
            plot_peers(where / f"peers-{name}.png", name, w)
        return out | {"written_to": str(where)}

    def report(self, figures: Figures) -> str:
        from fairgate.loadgen.peers.report import format_peers

        where = Path(figures["written_to"])
        return format_peers(figures) + f"\n\nwrote {where / 'peers.json'} and a plot per workload"
