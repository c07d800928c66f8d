"""Shared test settings: where the shared data lies, and hypothesis profiles."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FAIRGATE_SHARED", REPO.parent / "shared"))
SHARED_TRACE = SHARED / "data" / "arena_trace_lengths.csv"
SHARED_PROFILE = SHARED / "data" / "a10g_llama7b_cost_profile.json"

settings.register_profile("default", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture(scope="session")
def shared_trace() -> Path:
    if not SHARED_TRACE.is_file():
        pytest.fail(f"the shared real trace is missing at {SHARED_TRACE} (set FAIRGATE_SHARED)")
    return SHARED_TRACE
