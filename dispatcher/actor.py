"""The dispatcher as one named async Ray actor: a thin shell over ``DispatcherService``.

Every queued request is one pending ``submit`` call on this actor, so ``max_concurrency`` is far above
the largest queue accepted. Whoever needs the dispatcher first (ingress or worker replica) creates it;
the others find it by name. Ray restarts it when its process dies: the new instance reloads tenants and
counters from the state store (Redis when configured), workers re-attach and re-announce what they run,
and ingress replicas ask again for the requests that were waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from typing import Any

import ray
from pydantic import BaseModel

from fairgate.common.config import GatewayConfig
from fairgate.common.frame_guard import frame_limit
from fairgate.common.key_hashing import KeyHasher
from fairgate.common.loopback import bind_host, pool_port
from fairgate.common.prefix_hashes import for_adapter, salted
from fairgate.common.rpc import fairgate_pb2 as pb
from fairgate.common.waits import within
from fairgate.core import REJECT_UNKNOWN_KEY
from fairgate.core.journal import JournalWriter
from fairgate.core.quotas import QuotaBook
from fairgate.dispatcher.adapter_calls import AdapterCalls
from fairgate.dispatcher.adapter_registry import AdapterRegistry
from fairgate.dispatcher.admission_service import AdmissionServer, submit_args
from fairgate.dispatcher.fleet_view import shard_row, with_fleet
from fairgate.dispatcher.heap_freeze import HeapFreeze
from fairgate.dispatcher.metrics import ServiceHistory
from fairgate.dispatcher.names import dispatcher_name, dispatcher_resources, rounds_name
from fairgate.dispatcher.otlp_metrics import start_otlp_metrics
from fairgate.dispatcher.round_wire import RoundServer, last_from, last_json, report_json
from fairgate.dispatcher.rounds_actor import get_or_create_rounds
from fairgate.dispatcher.service import DispatcherService, Redirected, Rejected
from fairgate.dispatcher.state_store import StateStore, open_store
from fairgate.dispatcher.tenant_registry import ServiceClass, TenantError, TenantRegistry

log = logging.getLogger(__name__)

MAX_PENDING_CALLS = 100_000
QUOTA_STATE_KEY = "~quotas"  # where the quota book is saved, beside each pool's state
MAX_ROUND_FRAME_BYTES = 64 << 20  # a round's figures: every tenant's and node's, as JSON
FORGET_SETTLED_AFTER_S = 160.0  # longer than a worker re-announces what ended (150 s): kept for that


@ray.remote(num_cpus=0)
class DispatcherActor(AdapterCalls):
    """One scheduler per model pool (fairness is per pool: each pool is its own resource), each with
    its own Dispatcher gRPC service for its workers; tenants, keys and the live page are shared. Calls
    name their pool by model; without one, the first model's."""

    def __init__(self, app: str, config: GatewayConfig, secret: str, shard: int = 0) -> None:
        """``config``: the gateway's, as ``fairgate.gateway.config.deployable`` makes it; ``shard``: which
        of its ``shards.count`` dispatchers this is (docs/shards.md)."""
        self._app = app
        self._config = config
        self._shard = shard
        models = [m.name for m in config.models]
        self._quotas = QuotaBook(q.rule() for q in config.quotas)  # every pool's
        self._pools = {
            m: DispatcherService(config.scheduler, secret.encode(), quotas=self._quotas, prices=config.prices_of(m))
            for m in models
        }
        self._first = models[0]
        self._service = self._pools[self._first]
        self._classes = [ServiceClass(c.request_class(), c.tier_name) for c in config.classes]
        self._policy = config.scheduler.policy
        self._registry = TenantRegistry([], [], self._classes, self._policy)
        self._adapter_models = {m: config.adapter_models.get(m, False) for m in models}
        self._adapters = AdapterRegistry([], self._adapter_models)
        self._hasher = KeyHasher.from_environment(secret)  # upgrades plain digests a store still holds
        self._hasher.check_fingerprint(config.key_hash_fingerprint, "dispatcher")
        self._store: StateStore | None = None
        self._started: asyncio.Task[str] | None = None
        self._saver: asyncio.Task[None] | None = None
        self._history = ServiceHistory()  # per-tenant service once a second (metrics, live page)
        self._sampler: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None  # forgets settled requests, every so often
        self._changing = asyncio.Lock()  # tenant and node changes, one at a time
        self._latest: dict[str, Any] | None = None  # the last sampled telemetry (OTLP metrics read it)
        self._heap = HeapFreeze()
        self._admission = AdmissionServer(  # the ingress's per-request call
            self.admit, secret.encode(), frame_limit(config.ingress.max_body_bytes)
        )
        handlers = {"batches": self._round_batches, "adopt": self._round_adopt, "hand_over": self._hand_over}
        self._rounds = RoundServer(handlers | {"recall": self._recall}, secret.encode(), MAX_ROUND_FRAME_BYTES)

    async def _ready(self) -> str:
        """Load durable state and start the gRPC service, once; every call waits for it. A start that
        failed (e.g. Redis not reachable yet) is not kept: the next call tries again."""
        started = self._started
        if started is None or (started.done() and (started.cancelled() or started.exception() is not None)):
            started = self._started = asyncio.get_running_loop().create_task(self._start())
        return await asyncio.shield(started)

    async def _start(self) -> str:
        config = self._config
        self._store = await open_store(config.state, self._app)
        seed = [_stored(t) for t in config.tenants], [_stored(n) for n in config.tree]  # the store's rows
        tenants, nodes = await self._store.load_tenants(*seed)
        await self._upgrade_key_hashes(tenants)
        self._registry = TenantRegistry(tenants, nodes, self._classes, self._policy)
        self._load_adapters(await self._store.load_adapters([_stored(a) for a in config.adapters]))
        loop = asyncio.get_running_loop()
        network = config.network
        if self._quotas:
            saved_quotas = await self._store.load_state(QUOTA_STATE_KEY)
            if saved_quotas is not None:
                self._quotas.restore(saved_quotas)
        for index, (model, service) in enumerate(self._pools.items()):
            scheduler = service.scheduler
            saved = await self._store.load_state(self._state_key(model))
            if saved is not None:
                service.restore(saved)
                log.warning("dispatcher: %s continues from saved counters of %d tenants", model, len(saved["tenants"]))
            for name, parent, weight in self._registry.tree_order():
                scheduler.set_node(name, parent, weight)
            for t in tenants:
                scheduler.add_tenant(t["name"], float(t.get("weight", 1.0)), str(t.get("parent") or ""))
            port = pool_port(network.dispatcher_port, self._shard * len(self._pools) + index)
            await service.start(bind_host(), port)
        await self._admission.start(bind_host(), pool_port(network.admission_port, self._shard))
        if config.shards.count > 1:
            await self._rounds.start(bind_host(), pool_port(network.rounds_port, self._shard))
        self._saver = loop.create_task(self._save_every(config.state.snapshot_interval_s))
        self._sampler = loop.create_task(self._sample_every(1.0))
        self._sweeper = loop.create_task(self._forget_settled_every(FORGET_SETTLED_AFTER_S))
        telemetry = config.telemetry
        if telemetry.otlp_endpoint:
            start_otlp_metrics(lambda: self._latest, telemetry.top_tenants, telemetry.otlp_endpoint)
        return self._service.address

    async def _upgrade_key_hashes(self, tenants: list[dict[str, Any]]) -> None:
        """Tenants stored before keys were hashed with a secret: their plain digests become keyed hashes,
        in the store too (the same keys keep working; the store no longer holds an unkeyed hash)."""
        assert self._store is not None
        upgraded = 0
        for t in tenants:
            keyed = self._hasher.upgrade(t["key_hash"])
            if keyed != t["key_hash"]:
                t["key_hash"] = keyed
                await self._store.put_tenant(t)
                upgraded += 1
        if upgraded:
            log.warning("dispatcher: %d stored API key hashes upgraded to keyed hashes", upgraded)

    def _state_key(self, model: str) -> str:
        """Where a pool's state is saved: shard 0 keeps the one-dispatcher keys."""
        key = "" if model == self._first else model
        return f"{key}#{self._shard}" if self._shard else key

    def _pool(self, model: str | None) -> DispatcherService:
        service = self._pools.get(model or self._first)
        if service is None:
            raise ValueError(f"no model pool named {model!r}")
        return service

    async def _sample_every(self, interval_s: float) -> None:
        """The live page's and the OTLP exporter's figures; a failure skips one sample, never the rest.
        Also where the heap is refrozen once the fleet has settled after a change (``HeapFreeze``)."""
        while True:
            try:
                self._latest = self._history.record(time.time(), self._service.sample())
            except Exception:
                log.exception("dispatcher: taking a telemetry sample failed")
            now = time.monotonic()
            if self._heap.due(now, sum(len(s.scheduler.workers.slots) for s in self._pools.values())):
                self._heap.refreeze(now)
            await asyncio.sleep(interval_s)

    async def _forget_settled_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            for service in self._pools.values():
                service.scheduler.forget_settled()

    async def telemetry(self, series_s: float = 0.0) -> dict[str, Any]:
        """Stats, latency histograms, the gap against 2U, Jain's index over the last minute, service
        rates over the last 10 s, and (``series_s``) the sampled history for the live page."""
        await self._ready()
        data = self._service.telemetry()
        data["shard"] = self._shard
        data["quotas"] = self._quotas.view(None, time.time())
        data["jain"] = self._history.jain(60.0)
        data["rates"] = self._history.rates(10.0)
        if series_s:
            data["series"] = self._history.series(series_s)
        if len(self._pools) > 1:  # every pool's own figures (the top level: the first model's)
            data["pools"] = {m: service.telemetry() for m, service in self._pools.items()}
        if self._config.shards.count > 1 and self._shard == 0:
            await self._add_fleet(data)
        return data

    async def shard_summary(self) -> dict[str, Any]:
        """This shard's row of the fleet's figures (its first pool's)."""
        await self._ready()
        data = self._service.telemetry()
        return shard_row(self._shard, data, data["workers"])

    async def _add_fleet(self, data: dict[str, Any]) -> None:
        """Every shard's row, the rounds' figures and the fleet's gap and bound (``fleet_view``); a shard
        or runner that does not answer within a second is shown as such."""
        others = [
            ray.get_actor(dispatcher_name(self._app, k), namespace="fairgate").shard_summary.remote()
            for k in range(1, self._config.shards.count)
        ]
        runner = ray.get_actor(rounds_name(self._app), namespace="fairgate").figures.remote()
        answers = await asyncio.gather(*(within(ref, 1.0) for ref in [*others, runner]), return_exceptions=True)
        rows = [shard_row(self._shard, data, data["workers"])]  # this shard's, from what it just took
        rows += [None if isinstance(a, BaseException) else a for a in answers[:-1]]
        rounds = answers[-1] if not isinstance(answers[-1], BaseException) else {}
        with_fleet(data, rows, rounds.get(self._first, {}))

    async def _save_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.persist()

    async def persist(self) -> bool:
        """Write the durable state now (also called at shutdown). False when the store failed."""
        if self._store is None:
            return False
        try:
            for model, service in self._pools.items():
                state = service.durable_state(rounds=self._config.shards.count > 1)
                await self._store.save_state(state, self._state_key(model))
                service.saved(state)
            if self._quotas:
                started = [rid for service in self._pools.values() for rid in service.scheduler.started_ids()]
                await self._store.save_state(self._quotas.snapshot(started), QUOTA_STATE_KEY)
            return True
        except Exception as exc:  # serving goes on; the next interval tries again
            log.warning("dispatcher: could not save state: %s", exc)
            return False

    async def address(self, model: str | None = None) -> str:
        """The Dispatcher gRPC service of a model pool: its address (it changes when the actor restarts)."""
        await self._ready()
        return self._pool(model).address

    async def admission_address(self) -> str:
        """The Admission gRPC service the ingress submits to (it changes when the actor restarts)."""
        await self._ready()
        return self._admission.address

    async def admit(self, request: pb.SubmitRequest) -> pb.SubmitReply:
        """One request's turn (the Admission service's call): resolves when it is assigned, with where
        to run it and the signed ticket, or why it was refused. The caller's API key (its hash) is
        checked against the registry here, so a key revoked or rotated through any ingress replica
        stops working at once on all of them (their key caches notwithstanding). The prompt's block
        hashes are salted here by the tenant's cache group and its adapter (a prefix under one adapter
        is no hit under another); the client's ``service_tier`` (its request class) is checked against
        the classes its key may use, and the reply names the tier served. An adapter is checked again
        here: one deleted, or taken from the tenant, since its ingress last looked is not served."""
        args = submit_args(request)
        rid, tenant, n_prompt, max_tokens, retry, key_hash, model, prefix, block_tokens, tier, adapter = args
        await self._ready()
        if key_hash is None or self._registry.lookup(key_hash) != tenant:  # no key: no tenant, never a new one
            return pb.SubmitReply(rejected=REJECT_UNKNOWN_KEY)
        try:
            klass, served_tier = self._registry.class_for(tenant, tier)
        except TenantError as exc:
            return pb.SubmitReply(rejected="class_not_allowed", message=str(exc))
        service = self._pool(model)
        if adapter:  # the tenant may use it, on this pool (it may have been deleted or moved since)
            known = self.adapter_for(tenant, adapter)
            if known is None or self._pools.get(known.base_model) is not service:
                return pb.SubmitReply(rejected="model_not_found", message=f"the model '{adapter}' does not exist")
        record = self._registry.get(tenant)
        group = (record.cache_group if record is not None else "") or tenant
        cached = salted(for_adapter(prefix, adapter), group) if prefix and block_tokens > 0 else ()
        try:
            p = await service.submit(
                rid,
                tenant,
                n_prompt,
                max_tokens,
                retry=retry,
                prefix=cached,
                block_tokens=block_tokens,
                cache_group=group,
                klass=klass,
                adapter=adapter,
            )
        except Rejected as exc:
            return pb.SubmitReply(rejected=exc.reason, message=exc.message, retry_after_s=exc.retry_after_s)
        except Redirected as exc:  # dealt to another shard: its caller asks there
            return pb.SubmitReply(redirect=exc.shard)
        return pb.SubmitReply(
            shard=self._shard,
            counter=service.scheduler.tenants[tenant].counter,  # after the dispatch charge (traces)
            service_tier=served_tier,
            worker_id=p.worker_id,
            address=p.address,
            ticket=p.ticket_message(),
        )

    # ------------------------------------------------------------------ shards' rounds (round_wire.py)

    async def rounds_address(self) -> str:
        """The rounds' endpoint (it changes when the actor restarts)."""
        await self._ready()
        return self._rounds.address

    async def _round_batches(self, body: dict[str, Any]) -> dict[str, Any]:
        return report_json(self._pool(body["model"]).round_batches())

    async def _round_adopt(self, body: dict[str, Any]) -> dict[str, Any]:
        self._pool(body["model"]).round_adopt(last_from(body["last"]), str(self._shard), body["elsewhere"])
        return {}

    async def _hand_over(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"moved": self._pool(body["model"]).hand_over(body["tenant"], int(body["count"]), body["to"])}

    async def _recall(self, body: dict[str, Any]) -> dict[str, Any]:
        return last_json(self._pool(body["model"]).last_round())

    async def release(self, request_id: str, model: str | None = None) -> None:
        """The caller gave up on an assigned request before it started: free it now."""
        await self._ready()
        self._pool(model).release(request_id)

    async def abort(self, request_id: str, model: str | None = None) -> None:
        await self._ready()
        self._pool(model).abort(request_id)

    async def drain(self, worker_id: str, model: str | None = None) -> None:
        await self._ready()
        self._pool(model).drain(worker_id)

    async def stats(self, model: str | None = None) -> dict[str, Any]:
        await self._ready()
        return self._pool(model).stats()

    async def demand(self, model: str | None = None) -> dict[str, Any]:
        """Running and waiting load of a pool (read by its worker deployment's autoscaling policy)."""
        await self._ready()
        return dataclasses.asdict(self._pool(model).scheduler.demand())

    async def process(self) -> dict[str, Any]:
        """This actor's process: its pid (for chaos tests) and resident memory in bytes (for soaks)."""
        with open(f"/proc/{os.getpid()}/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return {"pid": os.getpid(), "rss_bytes": rss}

    async def load_counters(self) -> dict[str, dict[str, int]]:
        """Per pool, requests dispatched and worker messages received so far: what a load test reads
        often (nothing here grows with the pool)."""
        return {m: {"dispatched": s.dispatched, "worker_messages": s.worker_messages} for m, s in self._pools.items()}

    async def snapshot_cost(self, interval_s: float = 1.0) -> dict[str, float]:
        """What writing the durable state costs now, as the Redis store writes it (seconds of this
        process, bytes): a base (every pool's state built and encoded whole) and, ``interval_s`` later,
        the journal's change against it (built, compared, encoded)."""
        await self._ready()
        writers = {model: JournalWriter() for model in self._pools}

        def write_all() -> tuple[float, float]:
            started, written = time.process_time(), 0
            for model, service in self._pools.items():
                write = writers[model].next(service.durable_state())
                if write is not None:
                    writers[model].wrote()
                    written += len(write[1])
            return time.process_time() - started, float(written)

        base_seconds, base_bytes = write_all()
        await asyncio.sleep(interval_s)
        seconds, written = write_all()
        return {"base_seconds": base_seconds, "base_bytes": base_bytes, "seconds": seconds, "bytes": written}

    # ------------------------------------------------------------------ tenants (ingress and admin API)

    async def usage(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """The token quotas over ``tenant`` (its own and its tree nodes'; None: every quota), each with
        what its window has used, holds and has left."""
        await self._ready()
        if tenant is None:
            return self._quotas.view(None, time.time())
        t = self._service.scheduler.tenants.get(tenant)
        names = [tenant] if t is None else self._service.scheduler.quota_names(t)
        return self._quotas.view(names, time.time())

    async def lookup_key(self, key_hash: str) -> str | None:
        """The tenant owning an API key's hash, or None."""
        await self._ready()
        return self._registry.lookup(key_hash)

    async def list_tenants(self) -> list[dict[str, Any]]:
        """Every tenant with its weight, counter, exact service and queue (never a key or its hash)."""
        await self._ready()
        stats = self._service.scheduler.stats()
        counters, nodes = stats["tenants"], stats["nodes"]
        records = {name: self._registry.get(name) for name in self._registry.names()}
        rows = []
        for name, r in records.items():
            if r is None:
                continue
            row = {**counters.get(name, {"weight": r.weight}), "cache_group": r.cache_group, "classes": r.classes}
            own = nodes.get(name)
            if own is not None and own["implicit"]:  # its classes: the key's figures are its node's
                row |= {k: own[k] for k in ("weight", "counter", "service")}
                row["class_leaves"] = sorted(n for n, c in counters.items() if c["parent"] == name)
            rows.append({"name": name, **row, "parent": r.parent})
        return rows

    async def list_nodes(self) -> list[dict[str, Any]]:
        """Every tree node with its weight, parent, counter and exact service (of the first pool)."""
        await self._ready()
        nodes = self._service.scheduler.stats()["nodes"]
        return [
            {"name": n.name, **nodes.get(n.name, {}), "parent": n.parent, "weight": n.weight}
            for n in self._registry.nodes.values()
        ]

    async def change_tenant(
        self,
        action: str,
        name: str,
        key_hash: str | None = None,
        weight: float | None = None,
        cache_group: str | None = None,
        parent: str | None = None,
        classes: list[str] | None = None,
    ):
        """create / update / delete, saved to the store before it counts; returns the tenant's row, or
        {"error": (status, message)}. Changes go one at a time: a change that fails restores the
        registry as it was before it, which must not undo another change made meanwhile."""
        await self._ready()
        assert self._store is not None
        async with self._changing:
            before = self._registry.records()
            try:
                if action == "create":
                    weight = 1.0 if weight is None else weight
                    self._registry.create(name, key_hash or "", weight, cache_group or "", parent or "", classes)
                elif action == "update":
                    self._registry.update(name, weight, key_hash, cache_group, parent, classes)
                elif action == "delete":
                    self._registry.delete(name)  # its counters stay: re-creating the name gains no credit
                else:
                    raise TenantError(400, f"unknown action {action!r}")
                record = self._registry.get(name)
                if record is None:
                    await self._store.delete_tenant(name)
                else:
                    await self._store.put_tenant(record.to_dict())
            except TenantError as exc:
                return {"error": [exc.status, str(exc)]}
            except Exception as exc:  # the store failed: the change does not happen
                self._registry = TenantRegistry(before, self._registry.node_records(), self._classes, self._policy)
                log.warning("dispatcher: could not save a tenant change: %s", exc)
                return {"error": [503, "the tenant change could not be saved; retry later"]}
        for service in self._pools.values():  # the next dispatch uses the new weight and place, in every pool
            if record is None:  # its counters stay (re-creating the name gains no credit), out of the tree
                if name in service.scheduler.tenants:
                    service.scheduler.add_tenant(name, service.scheduler.tenants[name].weight, "")
            else:
                service.scheduler.add_tenant(name, record.weight, record.parent)
        if record is None:
            return {"name": name, "deleted": True}
        return next(row for row in await self.list_tenants() if row["name"] == name)

    async def change_node(self, action: str, name: str, parent: str | None = None, weight: float | None = None):
        """create / update (move, reweight) / delete a tree node, checked whole and saved to the store
        before it counts; returns the node's row, or {"error": (status, message)}. One change at a time,
        with the tenants' changes."""
        await self._ready()
        assert self._store is not None
        kept = any(name in service.scheduler.tenants for service in self._pools.values())
        if action == "create" and kept and self._registry.get(name) is None:
            return {"error": [409, f"{name!r} was a tenant (its counters are kept); a node needs a name of its own"]}
        async with self._changing:
            before = self._registry.node_records()
            try:
                if action == "delete":
                    self._registry.delete_node(name)
                    await self._store.delete_node(name)
                elif action in ("create", "update"):
                    record = self._registry.set_node(name, parent, weight, creating=action == "create")
                    await self._store.put_node(record.to_dict())
                else:
                    raise TenantError(400, f"unknown action {action!r}")
            except TenantError as exc:
                return {"error": [exc.status, str(exc)]}
            except Exception as exc:  # the store failed: the change does not happen
                self._registry = TenantRegistry(self._registry.records(), before, self._classes, self._policy)
                log.warning("dispatcher: could not save a node change: %s", exc)
                return {"error": [503, "the node change could not be saved; retry later"]}
        for service in self._pools.values():
            scheduler = service.scheduler
            if action == "delete":
                node = scheduler.tree.nodes.get(name)
                for member in list(node.kids.values()) if node is not None else ():  # leftovers of deleted tenants
                    scheduler.tree.move(member, "")
                if node is not None:
                    scheduler.delete_node(name)
            else:
                scheduler.set_node(name, record.parent, record.weight)
        if action == "delete":
            return {"name": name, "deleted": True}
        return next(row for row in await self.list_nodes() if row["name"] == name)

    async def shutdown(self) -> None:
        """Save the state one last time and close the store (``fairgate serve`` calls it on exit)."""
        if self._saver is not None:
            self._saver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._saver
        for task in (self._sampler, self._sweeper):
            if task is not None:
                task.cancel()
        await self.persist()
        await self._admission.stop()
        await self._rounds.stop()
        for service in self._pools.values():
            await service.stop()
        if self._store is not None:
            await self._store.close()


async def find_dispatcher(app: str, wait_s: float = 600.0, poll_s: float = 0.5, shard: int = 0):
    """The app's dispatcher (``shard``) once some ingress replica has created it: what a worker replica
    uses, so that workers are never given the settings it is created from (the state store's address
    and password, the tenants' key hashes)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return ray.get_actor(dispatcher_name(app, shard), namespace="fairgate")
        except ValueError:  # not created yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"no dispatcher for {app!r} after {wait_s:.0f} s") from None
            await asyncio.sleep(poll_s)


def get_or_create_dispatcher(app: str, config: GatewayConfig, secret: str, shard: int = 0):
    """The app's dispatcher (``shard``), created from ``config`` (``fairgate.gateway.config.deployable``'s)
    if there is none yet. Ray restarts it whenever its process dies."""
    return DispatcherActor.options(
        resources=dispatcher_resources(),
        name=dispatcher_name(app, shard),
        namespace="fairgate",
        get_if_exists=True,
        lifetime="detached",
        max_concurrency=MAX_PENDING_CALLS,
        max_restarts=-1,
    ).remote(app, config, secret, shard)


def get_or_create_dispatchers(app: str, config: GatewayConfig, secret: str) -> list[Any]:
    """Every shard of the app's dispatcher (one unless ``shards.count``), and their rounds' runner."""
    shards = [get_or_create_dispatcher(app, config, secret, k) for k in range(config.shards.count)]
    if len(shards) > 1:
        get_or_create_rounds(app, [m.name for m in config.models], config.shards, secret)
    return shards


def _stored(section: BaseModel) -> dict[str, Any]:
    """A configured tenant, tree node or adapter as the state store keeps its records (lists, not tuples)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in section.model_dump().items()}
