"""The workloads of ``fairgate bench peers``, sized for ``engines`` engines and ``seconds`` of replay.

- ``overload``: the paper's two tenants (256/256, 1.5 and 3 req/s per engine), both far above half.
- ``on_off``: the paper's on/off overload: A (2 req/s per engine) on and off in quarters of the run, B
  (3 req/s per engine) always on.
- ``real``: the real trace's statistics (27 clients; ``fairgate.loadgen.trace``), its arrivals ``engines`` times
  closer together.
- ``mooncake``: the Mooncake conversation trace (one heavy tenant, three light), prompts and answers
  scaled down to fit the simulated engines' pools (``MOONCAKE_SCALE``); turns of a conversation share
  their prefix, as the trace's block ids say.
- ``skew``: ``overload`` across two instances of each gateway: A's requests all through the first, B's
  split between both.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fairgate.loadgen.datasets import MOONCAKE_TRACE
from fairgate.loadgen.mooncake import MOONCAKE_BLOCK_TOKENS, load_mooncake
from fairgate.loadgen.workload import TraceRequest, Workload, WorkloadError
from fairgate.loadgen.workloads import Phase, TenantSpec, generate, overload, real

# Mooncake's prompts average ~12,000 tokens in 512-token blocks and its answers ~340: a sixteenth of
# each prompt (blocks of 32 tokens) and a quarter of each answer fit a 10,000-token simulated pool.
MOONCAKE_SCALE = (16, 4)
MOONCAKE_TIME_SCALE = 1.0  # the trace's own pace per engine
NAMES = ("overload", "on_off", "real", "mooncake", "skew")


@dataclass(frozen=True)
class PeerWorkload:
    """A workload as the bench replays it: ``block_tokens`` words per prefix block (0: every prompt its
    own), ``instances`` the gateway instances each tenant's requests take in turn (absent: the first)."""

    workload: Workload
    block_tokens: int = 0
    instances: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.workload.name

    @property
    def gateway_instances(self) -> int:
        return 1 + max((i for spread in self.instances.values() for i in spread), default=0)


def peer_workload(name: str, engines: int, seconds: float, seed: int = 42) -> PeerWorkload:
    if name == "overload":
        return PeerWorkload(_named(overload(seed, scale=engines).truncated(seconds), "overload"))
    if name == "on_off":
        quarter = seconds / 4
        specs = [
            TenantSpec("A", (Phase(0.0, seconds, 2.0, on_off_s=quarter),)),
            TenantSpec("B", (Phase(0.0, seconds, 3.0),)),
        ]
        return PeerWorkload(generate("on_off", seconds, specs, seed, engines))
    if name == "real":
        trace = real(seed)
        kept = [replace(r, arrival_s=r.arrival_s / engines) for r in trace.requests if r.arrival_s / engines < seconds]
        return PeerWorkload(Workload("real", seconds, kept, dict(trace.weights)))
    if name == "mooncake":
        return PeerWorkload(_mooncake(engines, seconds), MOONCAKE_BLOCK_TOKENS // MOONCAKE_SCALE[0])
    if name == "skew":
        w = _named(overload(seed, scale=engines).truncated(seconds), "skew")
        return PeerWorkload(w, instances={"A": (0,), "B": (0, 1)})
    raise WorkloadError(f"unknown workload {name!r} (one of {', '.join(NAMES)})")


def _named(w: Workload, name: str) -> Workload:
    w.name = name
    return w


def _mooncake(engines: int, seconds: float) -> Workload:
    trace = load_mooncake(MOONCAKE_TRACE, time_scale=MOONCAKE_TIME_SCALE * engines)
    prompt_div, output_div = MOONCAKE_SCALE
    kept = [
        TraceRequest(
            r.tenant,
            r.arrival_s,
            max(1, r.prompt_tokens // prompt_div),
            max(1, r.output_tokens // output_div),
            prefix=r.prefix,
        )
        for r in trace.requests
        if r.arrival_s < seconds
    ]
    return Workload("mooncake", seconds, kept, dict(trace.weights), prefix_block=MOONCAKE_BLOCK_TOKENS // prompt_div)
