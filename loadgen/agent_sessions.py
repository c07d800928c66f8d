"""A second conversation trace with prefixes: multi-turn agent sessions, built from a shape.

The Mooncake trace is one service's chat traffic. Agent traffic (coding assistants, tool-using
agents) reuses its prefixes differently: every session starts from its tenant's long system prompt
(instructions and tool definitions, the same for all of that tenant's sessions), loads its own
context (files of a repository), then runs many turns, each appending a tool's output and the
model's previous answer to the whole conversation so far. So it has both kinds of reuse, a
tenant-wide prefix and long per-session chains, and turns come seconds apart, not minutes.

No recording of such traffic is public with block hashes; this trace is generated, seeded, from the
shape below (the parameters are the module's constants; they are assumptions, stated here):

- sessions arrive as a Poisson process (``SESSIONS_PER_S``), dealt to tenants as the Mooncake
  workload deals conversations (one heavy tenant with 55%, three light ones with 15% each);
- a tenant's system prompt: ``SYSTEM_TOKENS``; a session's context: log-normal, median
  ``CONTEXT_MEDIAN`` tokens;
- turns per session: geometric, mean ``MEAN_TURNS``; each adds a tool output (log-normal, median
  ``TOOL_MEDIAN``) and the previous answer (log-normal, median ``OUTPUT_MEDIAN``, at most
  ``OUTPUT_MAX``); a session ends early once its prompt would pass ``MAX_PROMPT``;
- a turn arrives a think time after the previous one (exponential, mean ``THINK_MEAN_S``: the tool
  runs, the client reads), open loop like the Mooncake trace's timestamps.

Blocks are 512 tokens, as Mooncake's: a block's id names its tenant, its session (or the system
prompt) and its place, so equal ids are equal prefixes, and a prompt's partial last block carries none.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping

from fairgate.loadgen.mooncake import DEFAULT_SHARES, MOONCAKE_BLOCK_TOKENS, salt
from fairgate.loadgen.workload import TraceRequest, Workload, WorkloadError

SESSIONS_PER_S = 1.8
DURATION_S = 1_200.0
SYSTEM_TOKENS = 3_072
CONTEXT_MEDIAN = 6_000
MEAN_TURNS = 8.0
TOOL_MEDIAN = 900
OUTPUT_MEDIAN = 250
OUTPUT_MAX = 2_048
MAX_PROMPT = 32_000
THINK_MEAN_S = 20.0
SIGMA = 0.8  # of every log-normal above
AGENT_SESSIONS = "agent-sessions"


def _lognormal(rng: random.Random, median: float) -> int:
    return max(1, int(rng.lognormvariate(0.0, SIGMA) * median))


def _block_id(tenant_salt: int, owner: int, index: int) -> int:
    """A stable 32-bit id for block ``index`` of ``owner`` (0: the system prompt, else a session)."""
    return tenant_salt | zlib.crc32(f"{owner}:{index}".encode())


def agent_sessions(
    time_scale: float = 1.0,
    limit: int | None = None,
    seed: int = 7,
    shares: Mapping[str, float] | None = None,
    duration_s: float = DURATION_S,
) -> Workload:
    """The generated trace as a workload: arrivals divided by ``time_scale``, the first ``limit``
    requests, tenants in ``shares`` (module docstring)."""
    if time_scale <= 0:
        raise WorkloadError("agent sessions: the time scale must be positive")
    shares = dict(shares or DEFAULT_SHARES)
    names, total = list(shares), sum(shares.values())
    rng = random.Random(seed)
    requests: list[TraceRequest] = []
    t, session = 0.0, 0
    while True:
        t += rng.expovariate(SESSIONS_PER_S)
        if t >= duration_s:
            break
        session += 1
        u, acc, tenant = rng.random() * total, 0.0, names[-1]
        for name in names:
            acc += shares[name]
            if u < acc:
                tenant = name
                break
        s = salt(tenant)
        prompt = SYSTEM_TOKENS + _lognormal(rng, CONTEXT_MEDIAN)
        arrival = t
        turns = 1 + int(rng.expovariate(1.0 / (MEAN_TURNS - 1.0)))  # about geometric, mean MEAN_TURNS
        for _ in range(turns):
            if prompt > MAX_PROMPT:
                break
            output = min(OUTPUT_MAX, _lognormal(rng, OUTPUT_MEDIAN))
            system_blocks = SYSTEM_TOKENS // MOONCAKE_BLOCK_TOKENS
            full = prompt // MOONCAKE_BLOCK_TOKENS
            prefix = tuple(_block_id(s, 0, i) if i < system_blocks else _block_id(s, session, i) for i in range(full))
            requests.append(TraceRequest(tenant, arrival / time_scale, prompt, output, None, prefix))
            prompt += output + _lognormal(rng, TOOL_MEDIAN)
            arrival += rng.expovariate(1.0 / THINK_MEAN_S)
    requests.sort(key=lambda r: (r.arrival_s, r.tenant))
    if limit is not None:
        requests = requests[:limit]
    if not requests:
        raise WorkloadError("agent sessions: no requests")
    duration = max(1.0, requests[-1].arrival_s)
    return Workload(AGENT_SESSIONS, duration, requests, dict.fromkeys(names, 1.0), None, MOONCAKE_BLOCK_TOKENS)
