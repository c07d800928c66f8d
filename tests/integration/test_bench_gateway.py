"""The gateway benchmark's dispatcher path (real gRPC between an in-process dispatcher and worker)."""

from __future__ import annotations

import asyncio

from fairgate.loadgen.benches.gateway import dispatcher_requests_per_second


def test_dispatcher_benchmark_runs_with_its_telemetry_on_and_off():
    for telemetry in (False, True):
        assert asyncio.run(dispatcher_requests_per_second(300, telemetry=telemetry)) > 0
