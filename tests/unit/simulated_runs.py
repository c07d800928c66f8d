"""Random and adversarial workloads run through the simulator (the real core and the real engine
model in virtual time), and an independent measure of the fairness bound on what they served."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from fairgate.loadgen.simulator import Simulation, SimulationConfig
from fairgate.loadgen.workload import TraceRequest, Workload

POOL = 1200

requests_strategy = st.lists(
    st.tuples(
        st.integers(0, 2),  # tenant
        st.floats(0, 20, allow_nan=False),  # arrival
        st.integers(1, 300),  # prompt
        st.integers(1, 300),  # output
        st.booleans(),  # its client leaves after that output, from a max_tokens twice as large
    ),
    min_size=2,
    max_size=70,
)

# An adversary: one tenant floods with the longest prompts at once, another trickles tiny requests.
FLOOD = [(0, 0.0, 300, 300, False)] * 20 + [(1, 0.1 * i, 1, 1, False) for i in range(40)]
# Bursts from three tenants at the same instants, lengths at the extremes.
BURSTS = [(i % 3, float(i // 9) * 3.0, 1 if i % 2 else 300, 300 if i % 2 else 1, False) for i in range(60)]
# A tenant whose clients leave its long requests before they end, beside a steady one; and the same
# tenant first teaching short outputs with twenty 1-token answers.
LEAVER = [(0, 1.0 + 0.2 * i, 8, 280, True) for i in range(30)] + [(1, 0.5 * i, 120, 120, False) for i in range(40)]
POISON = [(0, 0.0, 4, 1, False)] * 20 + LEAVER


PREFIX_BLOCK = 16


def workload_of(rows, weights=(1.0, 1.0, 1.0), prefixed: bool = False, adapters: bool = False) -> Workload:
    """Rows: (tenant, arrival, prompt, output), and optionally whether its client leaves after that
    output (from a ``max_tokens`` twice as large). ``prefixed``: each prompt carries block hashes of
    one of two conversations of its tenant (by its length's parity), so prefix caches, cache-aware
    cost and locality slack come into play. ``adapters``: each conversation has a LoRA adapter of its
    own (more adapters than an engine's batch holds)."""

    def adapter(t: int, p: int) -> str:
        return f"lora-{t}{p % 2}" if adapters else ""

    def prefix(t: int, p: int) -> tuple[int, ...]:
        return tuple((t * 10 + p % 2) * 1000 + i for i in range(p // PREFIX_BLOCK)) if prefixed else ()

    reqs = sorted(
        (
            TraceRequest(
                f"T{t}", a, p, o, 2 * o if leaves else None, prefix(t, p), leaves=leaves, adapter=adapter(t, p)
            )
            for t, a, p, o, leaves in ((*row, False)[:5] for row in rows)
        ),
        key=lambda r: (r.arrival_s, r.tenant),
    )
    block = PREFIX_BLOCK if prefixed else 0
    return Workload("prop", 30.0, reqs, {f"T{i}": w for i, w in enumerate(weights)}, None, block)


def run(workload: Workload, policy: str = "vtc", **kw) -> Simulation:
    sim = Simulation(workload, SimulationConfig(policy=policy, kv_tokens=POOL, drain=True, **kw))
    sim.advance(float("inf"))
    return sim


def brute_force_max_gap(sim: Simulation) -> dict[tuple[int, int], float]:
    """max |W_f(t1,t2) - W_g(t1,t2)| over every pair of samples inside a stretch where f and g are
    both backlogged, by direct comparison of all sample pairs (independent of the metrics code)."""
    service = np.asarray(sim.recorder.sample_service)
    backlog = np.asarray(sim.recorder.sample_backlog, dtype=bool)
    out: dict[tuple[int, int], float] = {}
    n = service.shape[1] if service.size else 0
    for f in range(n):
        for g in range(f + 1, n):
            both = backlog[:, f] & backlog[:, g]
            best = 0.0
            i = 0
            while i < len(both):
                if not both[i]:
                    i += 1
                    continue
                j = i
                while j < len(both) and both[j]:
                    j += 1
                d = service[i:j, f] - service[i:j, g]
                best = max(best, float(np.abs(d[:, None] - d[None, :]).max()))
                i = j
            out[(f, g)] = best
    return out
