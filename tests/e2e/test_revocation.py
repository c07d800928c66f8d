"""Revocation by over-service through the whole gateway (simulated workers): a request an engine holds
unstarted is taken back from the flooding tenant for a light one that waits, served later, and neither
run twice nor charged twice (docs/architecture.md, "Revocation"). The same with vLLM: tests/e2e/test_vllm.py."""

from __future__ import annotations

import pytest

from .gateway_helpers import Gateway, deploy, revocation_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gw(serve_port) -> Gateway:
    gateway = deploy(
        "revoking",
        serve_port,
        tenants=("alice", "bob"),
        workers=1,
        max_running=2,
        step_s=0.02,
        kv_tokens=100_000,
        revoke=True,
    )
    yield gateway
    gateway.delete()


def test_a_light_tenant_takes_back_the_floods_unstarted_request_which_runs_later_once(gw):
    revocation_run(gw)
