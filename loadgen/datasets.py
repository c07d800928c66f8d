"""The data files that ship with fairgate (``loadgen/data``; their origins in its README): the VTC
paper's real-trace lengths and A10G cost profile, and the Mooncake conversation trace."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
ARENA_TRACE = DATA_DIR / "arena_trace_lengths.csv"
COST_PROFILE = DATA_DIR / "a10g_llama7b_cost_profile.json"
MOONCAKE_TRACE = DATA_DIR / "mooncake_conversation_trace.jsonl"
