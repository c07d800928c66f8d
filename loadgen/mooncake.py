"""The Mooncake conversation trace (``mooncake_conversation_trace.jsonl``) as a workload with prefixes.

Each line is one request of a production chat service: ``timestamp`` (ms), ``input_length``,
``output_length`` and ``hash_ids``, the ids of its prompt's 512-token KV blocks (equal ids: the same
prefix, so cacheable KV). The trace has no tenants; they are derived from conversations:

- a conversation is the second block id (every request shares the first, a common system prompt;
  a request of one block is a conversation of its own), so every turn of a conversation belongs to
  one tenant and its next turn can find the previous one's KV;
- conversations are dealt to tenants by a stable hash of their id, in the given shares (default: one
  heavy tenant with 55% of the conversations and three light ones with 15% each).

Block ids are salted per tenant (``salt``): the same system prompt of two tenants is two different
blocks, as the gateway's per-tenant cache salt makes it (docs/architecture.md). Tenants in one sharing group
share a salt. Only full blocks are cacheable: a prompt's partial last block carries no hash.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from pathlib import Path

from fairgate.loadgen.workload import TraceRequest, Workload, WorkloadError

MOONCAKE_BLOCK_TOKENS = 512
DEFAULT_SHARES = {"heavy": 0.55, "light-a": 0.15, "light-b": 0.15, "light-c": 0.15}


def salt(tenant_or_group: str) -> int:
    """A stable per-tenant (or per-group) salt for block ids (the same in every process)."""
    return zlib.crc32(tenant_or_group.encode()) << 32


def load_mooncake(
    path: str | Path,
    shares: Mapping[str, float] | None = None,
    time_scale: float = 1.0,
    limit: int | None = None,
    groups: Mapping[str, str] | None = None,
) -> Workload:
    """The trace as a workload: arrivals divided by ``time_scale`` (2: twice the load), the first
    ``limit`` requests, tenants by conversation (``shares``), blocks salted per tenant or per group
    (``groups``: tenant -> sharing group)."""
    shares = dict(shares or DEFAULT_SHARES)
    if not shares or any(v <= 0 for v in shares.values()):
        raise WorkloadError("mooncake: tenant shares must be positive")
    if time_scale <= 0:
        raise WorkloadError("mooncake: the time scale must be positive")
    names = list(shares)
    total = sum(shares.values())
    edges: list[float] = []
    acc = 0.0
    for name in names:
        acc += shares[name] / total
        edges.append(acc)
    salts = {name: salt((groups or {}).get(name, name)) for name in names}
    requests: list[TraceRequest] = []
    try:
        with open(path) as fh:
            for line_no, line in enumerate(fh, start=1):
                if limit is not None and len(requests) >= limit:
                    break
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    t_ms, n_in, n_out = float(row["timestamp"]), int(row["input_length"]), int(row["output_length"])
                    ids = [int(h) for h in row["hash_ids"]]
                except (ValueError, KeyError, TypeError):
                    raise WorkloadError(f"mooncake trace {path}: line {line_no}: not a trace record") from None
                if t_ms < 0 or n_in < 1 or n_out < 1:
                    raise WorkloadError(f"mooncake trace {path}: line {line_no}: negative time or empty lengths")
                conversation = ids[1] if len(ids) > 1 else -line_no
                tenant = names[_bucket(conversation, edges)]
                full = ids[: n_in // MOONCAKE_BLOCK_TOKENS]
                s = salts[tenant]
                prefix = tuple(s | h for h in full)
                requests.append(TraceRequest(tenant, t_ms / 1000.0 / time_scale, n_in, n_out, None, prefix))
    except OSError as exc:
        raise WorkloadError(f"mooncake trace {path}: cannot read: {exc}") from None
    if not requests:
        raise WorkloadError(f"mooncake trace {path}: no requests")
    requests.sort(key=lambda r: (r.arrival_s, r.tenant))
    duration = max(1.0, requests[-1].arrival_s)
    return Workload(Path(path).stem, duration, requests, dict.fromkeys(names, 1.0), None, MOONCAKE_BLOCK_TOKENS)


def _bucket(conversation: int, edges: list[float]) -> int:
    u = zlib.crc32(str(conversation).encode()) / 2**32
    for i, edge in enumerate(edges):
        if u < edge:
            return i
    return len(edges) - 1
