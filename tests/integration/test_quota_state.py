"""The quota book outlives the dispatcher: saved with its state in Redis, a new dispatcher continues
with the same usage and the holds of requests that had started (in process, the actor's class
without Ray)."""

from __future__ import annotations

import asyncio
import uuid

import yaml

from fairgate.common.config import GatewayConfig
from fairgate.core.quotas import Amount
from fairgate.dispatcher.actor import DispatcherActor
from fairgate.gateway.config import deployable, parse_config

SECRET = "q" * 32


def _settings(redis_url: str) -> GatewayConfig:
    with open("gateway/default_config.yaml") as f:
        raw = yaml.safe_load(f)
    raw["state"] = {"redis_url": redis_url}
    raw["quotas"] = [{"node": raw["tenants"][0]["name"], "window": "day", "max_tokens": 10_000}]
    config, _ = parse_config(raw)
    return deployable(config, SECRET)


def test_a_new_dispatcher_continues_with_the_saved_usage_and_holds(redis_url):
    settings = _settings(redis_url)
    tenant = settings.quotas[0].node
    app = "quota-" + uuid.uuid4().hex[:6]

    async def scenario():
        first = DispatcherActor.__ray_actor_class__(app, settings, SECRET)
        await first._ready()
        s = first._service.scheduler
        s.worker_join("w", kv_tokens=100_000)
        now = 1_000_000.0
        for rid, out in (("done", 300), ("running", 0)):
            assert s.submit(rid, tenant, 100, 900, now) is None
            s.assign(now)
            s.on_report("w", {rid: out} if out else {}, started={rid: 100})
        s.on_finish("done", 300, "stop", now)  # used 400; "running" holds 1,000
        assert await first.persist()
        before = first._quotas.view([tenant], now)
        await first.shutdown()

        second = DispatcherActor.__ray_actor_class__(app, settings, SECRET)
        await second._ready()
        after = second._quotas.view([tenant], now)
        assert [(r["used_tokens"], r["held_tokens"]) for r in after] == [(400, 1000)]
        assert after == before
        second._quotas.settle("running", Amount(250, 0.0), [tenant], now)  # its worker announces it ended
        assert second._quotas.view([tenant], now)[0]["used_tokens"] == 650
        await second.shutdown()

    asyncio.run(scenario())
