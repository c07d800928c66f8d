"""The OpenAI-compatible ingress: a Ray Serve deployment, stateless, any number of replicas; its HTTP
application is ``ingress/http_app.py``.

Per request: identify the tenant from its API key (and nothing else), count prompt tokens with the
engine's tokenizer, submit the metadata to the dispatcher, then stream from the assigned worker
straight to the client. A client that disconnects while queued withdraws its request; one that
disconnects while streaming aborts it at the worker.
"""

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from ray import serve

from fairgate.common.config import GatewayConfig
from fairgate.common.key_hashing import KeyHasher
from fairgate.common.openai_errors import ApiError, parse_body
from fairgate.common.replica_rank import shard_of_replica
from fairgate.common.rpc import fairgate_pb2 as pb
from fairgate.common.tracing import RequestTrace, configure_tracing
from fairgate.core.reasons import FINISH_REVOKED
from fairgate.dispatcher.actor import get_or_create_dispatchers
from fairgate.ingress.admin_routes import AdminRoutes
from fairgate.ingress.admission_client import AdmissionClient, DispatcherUnavailable
from fairgate.ingress.auth import KeyCache, LookupBudget, bearer_key, is_admin_key
from fairgate.ingress.dispatcher_client import DispatcherClient
from fairgate.ingress.errors import rejection_error
from fairgate.ingress.generation import Outcome, WorkerConnections, WorkerLost, stream_bytes
from fairgate.ingress.http_app import ASGIApp, ByteRelay, build_http_app
from fairgate.ingress.listener import DirectListener
from fairgate.ingress.observability_routes import ObservabilityRoutes
from fairgate.ingress.open_requests import OpenRequests, released_after
from fairgate.ingress.openai_api import ChatFields, CompletionFields, parse_json
from fairgate.ingress.pools import ModelPools, Served, not_found
from fairgate.ingress.service_tier import echo_tier
from fairgate.ingress.shard_admission import FAILOVER_S, ShardedAdmission

DISPATCHER_WAIT_S = 60.0  # how long a request waits for a restarting dispatcher
MAX_PLACEMENTS = 5  # placements of one request whose workers were lost before its first token
MAX_REVOCATIONS = 64  # times one request may be taken back unstarted (each time a less served tenant went first)


INLINE_TOKENIZE_BYTES = 16_384  # larger bodies are tokenized off the event loop (it serves every client)
log = logging.getLogger(__name__)


def _sse_error(error: ApiError) -> bytes:
    """A failure after the stream began: a last event the client can read, then the end."""
    return f"data: {json.dumps(error.body())}\n\ndata: [DONE]\n\n".encode()


# Serve runs a replica's code on a second thread by default, and every message of every request then
# crosses between that thread's event loop and the HTTP server's (its cost: docs/speed.md). The
# ingress's code never blocks its loop (long
# prompts are tokenized on a worker thread), so it runs on the server's own loop.
SAME_LOOP = {"env_vars": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}}


SHARD_HEADER = "x-fairgate-shard"

GRACEFUL_SHUTDOWN_S = 120  # a replica going away finishes the streams it relays, for up to this long


INGRESS_ACTOR_OPTIONS = {"num_cpus": 0, "runtime_env": SAME_LOOP}


@serve.deployment(
    ray_actor_options=INGRESS_ACTOR_OPTIONS,
    max_ongoing_requests=10_000,
    graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
    max_surge_percent=100,  # a redeploy starts the new replicas first: the port is never without a listener
    logging_config={"enable_access_log": False, "log_level": "WARNING"},
)
@serve.ingress()
class Ingress(AdminRoutes, ObservabilityRoutes):
    def __init__(
        self, app_name: str, config: GatewayConfig, secret: str, workers: Any = None, listen: str | None = None
    ) -> None:
        """``listen``: host:port of the direct front door (``ingress/listener.py``); None when Serve's
        own front door (its proxy or HAProxy) brings the requests."""
        configure_tracing(config.telemetry, "fairgate-ingress")
        self._max_body_bytes = config.ingress.max_body_bytes
        self._body_timeout_s = config.ingress.body_timeout_s
        self._open = OpenRequests(config.ingress.max_open_per_tenant)
        self._hasher = KeyHasher.from_environment(secret)
        self._hasher.check_fingerprint(config.key_hash_fingerprint, "ingress")
        self._keys = KeyCache({t.key_hash: t.name for t in config.tenants})
        self._lookups = LookupBudget()
        self._renewing: dict[str, asyncio.Task[None]] = {}  # key hash -> its answer being renewed
        self._admin_key_hash = config.admin_key_hash
        self._dispatcher = DispatcherClient(get_or_create_dispatchers(app_name, config, secret), DISPATCHER_WAIT_S)
        self._pools = ModelPools(config, self._dispatcher.adapters_for)
        shards = self._dispatcher.shards
        self._admission = ShardedAdmission(
            [self._admission_client(k, secret, FAILOVER_S if shards > 1 else DISPATCHER_WAIT_S) for k in range(shards)],
            shard_of_replica(shards),
            DISPATCHER_WAIT_S,
        )
        self._connections = WorkerConnections(secret.encode())
        self._workers = workers  # the worker deployment, bound so that Serve runs it with this app
        self._top_tenants = config.telemetry.top_tenants
        self._classes = bool(config.classes)  # responses then name the tier they were served in
        self._snapshot: tuple[float, dict[str, Any]] | None = None
        self._listen = listen
        self._listener: DirectListener | None = None

    def _admission_client(self, shard: int, secret: str, wait_s: float) -> AdmissionClient:
        return AdmissionClient(
            lambda: self._dispatcher.admission_address(shard),
            secret,
            wait_s,
            abandoned=lambda request: self._dispatcher.release(request.request_id, request.model, shard),
        )

    async def __serve_build_asgi_app__(self) -> ASGIApp:
        """The replica's ASGI app (generation served directly, the rest through FastAPI), also served on
        the direct front door's port when there is one."""
        app = build_http_app(self)
        if self._listen:
            self._listener = DirectListener(app, self._listen)
            await self._listener.start()
        return app

    async def check_health(self) -> None:
        if self._listener is not None and not self._listener.healthy():
            raise RuntimeError("the ingress's HTTP server has stopped")

    async def __del__(self) -> None:
        """Going away (scaled down, redeployed, shut down): take no new connections, finish what runs."""
        if self._listener is not None:
            await self._listener.stop(GRACEFUL_SHUTDOWN_S - 10)

    # ------------------------------------------------------------------ routes

    def add_routes(self, app: FastAPI) -> None:
        for path, endpoint, methods, status in (
            ("/healthz", self.healthz, ["GET"], 200),
            ("/v1/models", self.models, ["GET"], 200),
            ("/v1/models/{model:path}", self.model, ["GET"], 200),
            ("/v1/usage", self.usage, ["GET"], 200),
            ("/metrics", self.metrics, ["GET"], 200),
            ("/dashboard", self.dashboard, ["GET"], 200),
            ("/admin/dashboard.json", self.dashboard_data, ["GET"], 200),
            ("/admin/tenants", self.admin_list, ["GET"], 200),
            ("/admin/tenants", self.admin_create, ["POST"], 201),
            ("/admin/tenants/{name}", self.admin_update, ["PATCH"], 200),
            ("/admin/tenants/{name}", self.admin_delete, ["DELETE"], 200),
            ("/admin/nodes", self.admin_nodes, ["GET"], 200),
            ("/admin/nodes", self.admin_create_node, ["POST"], 201),
            ("/admin/nodes/{name}", self.admin_update_node, ["PATCH"], 200),
            ("/admin/nodes/{name}", self.admin_delete_node, ["DELETE"], 200),
            ("/admin/adapters", self.admin_adapters, ["GET"], 200),
            ("/admin/adapters", self.admin_create_adapter, ["POST"], 201),
            ("/admin/adapters/{name:path}", self.admin_update_adapter, ["PATCH"], 200),
            ("/admin/adapters/{name:path}", self.admin_delete_adapter, ["DELETE"], 200),
            ("/admin/stats", self.admin_stats, ["GET"], 200),
            ("/admin/usage", self.admin_usage, ["GET"], 200),
        ):
            app.add_api_route(path, endpoint, methods=methods, status_code=status)

    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    async def models(self, request: Request) -> dict[str, Any]:
        """The models this tenant may use."""
        tenant = await self._tenant(request)
        return {"object": "list", "data": await self._pools.listing(tenant)}

    async def usage(self, request: Request) -> dict[str, Any]:
        """The caller's own token quotas (its tenant's and its tree nodes'): used, held, left, reset."""
        tenant = await self._tenant(request)
        return {"object": "usage", "tenant": tenant, "quotas": await self._dispatcher.usage(tenant)}

    async def model(self, model: str, request: Request) -> dict[str, Any]:
        tenant = await self._tenant(request)
        return await self._pools.card(model, tenant)

    # ------------------------------------------------------------------ one request

    async def generation(self, request: Request, endpoint: str) -> ASGIApp:
        """``POST /v1/chat/completions`` (``endpoint`` "chat") or ``/v1/completions``: admit the
        request (its size, estimated as the engine counts), wait for its turn, then relay the engine's
        answer from the assigned worker, bytes unchanged. It counts as one of its tenant's open
        requests here until its answer has gone (``ingress/open_requests.py``)."""
        tenant, key_hash = await self._caller(request)
        release = self._open.take(tenant)
        try:
            answer = await self._answer(request, endpoint, tenant, key_hash)
        except BaseException:
            release()
            raise
        return released_after(answer, release)

    async def _answer(self, request: Request, endpoint: str, tenant: str, key_hash: str) -> ASGIApp:
        raw = await self._raw_body(request)
        req = parse_body(ChatFields if endpoint == "chat" else CompletionFields, parse_json(raw))
        served = await self._pools.served(req.model, tenant)
        pool = served.pool
        if len(raw) > INLINE_TOKENIZE_BYTES:  # long prompts: tokenized off the event loop
            admitted = await asyncio.to_thread(pool.prompting.admit, req)
        else:
            admitted = pool.prompting.admit(req)
        generate_request = pb.GenerateRequest(
            endpoint=endpoint,
            body=raw,
            prompt_tokens=admitted.prompt_tokens,
            max_tokens=admitted.max_tokens,
            choices=admitted.choices,
        )
        rid = ("chatcmpl-" if endpoint == "chat" else "cmpl-") + uuid.uuid4().hex
        trace = RequestTrace(
            {
                "fairgate.request_id": rid,
                "fairgate.tenant": tenant,
                "fairgate.model": pool.name,
                "fairgate.adapter": served.adapter,
                "fairgate.stream": bool(req.stream),
                "fairgate.prompt_tokens": admitted.prompt_tokens,
                "fairgate.max_tokens": admitted.max_tokens,
            }
        )
        try:
            with trace.queue_span() as queue:
                placement = await self._submit(
                    pool.name,
                    rid,
                    tenant,
                    key_hash,
                    admitted.prompt_tokens,
                    admitted.max_tokens,
                    admitted.prefix,
                    admitted.block_tokens,
                    tier=req.service_tier,
                    adapter=served.adapter,
                )
                trace.dispatched(queue, placement.worker_id, placement.counter)
        except BaseException as exc:
            trace.finish(admitted.prompt_tokens, 0, None, error=type(exc).__name__)
            raise
        outcome = Outcome()
        data = self._generate(served, tenant, key_hash, placement, generate_request, outcome, trace)
        error = ""
        try:
            first = await anext(data, b"")
        except WorkerLost as exc:
            await data.aclose()
            trace.finish(outcome.prompt_tokens, outcome.completion_tokens, outcome.finish_reason, "worker_failed")
            raise ApiError(502, str(exc), type_="server_error", code="worker_failed") from None
        except BaseException as exc:
            await data.aclose()  # type: ignore[attr-defined]  # client gone: stop the worker at once
            trace.finish(outcome.prompt_tokens, outcome.completion_tokens, outcome.finish_reason, type(exc).__name__)
            raise
        tier = placement.service_tier if self._classes and outcome.status < 400 else ""
        if outcome.content_type.startswith("text/event-stream"):
            events = self._relay(pool.name, rid, first, data, outcome, trace, tier)
            relay = ByteRelay(events, outcome.status, outcome.content_type)
            relay.headers += [(k.encode(), v.encode()) for k, v in self._shard_header(outcome).items()]
            return relay
        try:
            content = echo_tier(first + b"".join([piece async for piece in data]), tier, stream=False)
        except WorkerLost as exc:
            error = "worker_failed"
            raise ApiError(502, str(exc), type_="server_error", code="worker_failed") from None
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            await data.aclose()  # type: ignore[attr-defined]
            trace.finish(outcome.prompt_tokens, outcome.completion_tokens, outcome.finish_reason, error)
        return Response(
            content,
            status_code=outcome.status,
            media_type=outcome.content_type or "application/json",
            headers=self._shard_header(outcome),
        )

    def _shard_header(self, outcome: Outcome) -> dict[str, str]:
        """With dispatcher shards, which one placed the request (where its worker is)."""
        return {SHARD_HEADER: str(outcome.shard)} if self._dispatcher.shards > 1 else {}

    async def _relay(
        self,
        model: str,
        rid: str,
        first: bytes,
        data: AsyncIterator[bytes],
        outcome: Outcome,
        trace: RequestTrace,
        tier: str = "",
    ) -> AsyncIterator[bytes]:
        """A stream's bytes to the client as they come (each event naming ``tier`` when set); a
        failure after the first byte becomes a final error event. However it ends (the client
        leaving included), the worker is stopped and the trace finished."""
        error = ""
        try:
            if not tier:
                yield first
                async for piece in data:
                    yield piece
            else:
                yield echo_tier(first, tier, stream=True)
                async for piece in data:
                    yield echo_tier(piece, tier, stream=True)
        except WorkerLost as exc:
            error = "worker_failed"
            yield _sse_error(ApiError(502, str(exc), type_="server_error", code="worker_failed"))
        except BaseException as exc:  # the client went away
            error = type(exc).__name__
            raise
        finally:
            await data.aclose()  # type: ignore[attr-defined]
            self._release_unstarted(model, rid, outcome)
            trace.finish(outcome.prompt_tokens, outcome.completion_tokens, outcome.finish_reason, error)

    async def _submit(
        self,
        model: str,
        rid: str,
        tenant: str,
        key_hash: str,
        prompt_tokens: int,
        max_tokens: int,
        prefix: tuple[int, ...] = (),
        block_tokens: int = 0,
        retry: bool = False,
        tier: str | None = None,
        adapter: str = "",
        shard: int | None = None,
    ) -> pb.SubmitReply:
        """Queue the request in its model's pool; returns its placement. Asked again after a dispatcher
        restart with the same id and ``retry`` set, so it never runs twice. The dispatcher checks the
        key again, the request class (``tier``) and the ``adapter`` the key may use. Cancelling (the client left while
        queued) withdraws the request."""
        request = pb.SubmitRequest(
            request_id=rid,
            tenant=tenant,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            retry=retry,
            key_hash=key_hash,
            model=model,
            prefix=prefix,
            block_tokens=block_tokens,
            tier=tier,
            adapter=adapter,
        )
        try:
            placement = await self._admission.submit(request, shard)
        except DispatcherUnavailable:
            raise rejection_error("dispatcher_unavailable") from None
        if placement.rejected:
            if placement.rejected == "class_not_allowed":
                raise ApiError(400, placement.message, param="service_tier", code="invalid_service_tier")
            if placement.rejected == "model_not_found":  # the adapter was deleted or taken from it meanwhile
                raise not_found(adapter)
            raise rejection_error(placement.rejected, placement.message, placement.retry_after_s)
        return placement

    async def _generate(
        self,
        served: Served,
        tenant: str,
        key_hash: str,
        placement: pb.SubmitReply,
        request: pb.GenerateRequest,
        outcome: Outcome,
        trace: RequestTrace,
    ) -> AsyncIterator[bytes]:
        """The engine's bytes from the assigned worker. A worker lost before it sent anything (crashed,
        unreachable, ticket refused): the dispatcher places the request again, same id, at the head of
        its tenant's queue. One its worker took back unstarted (revocation) waits there again, at once and
        not counted as a failure. Once anything arrived, a lost worker ends the request with an error. However
        it ends before its worker sent anything (a failure, the client leaving), its reservation is
        freed at once: no one waits for its ticket to expire."""
        rid = placement.ticket.request_id
        model = served.pool.name
        attempt = revoked = 0
        try:
            while True:
                outcome.shard = placement.shard
                request.ticket.CopyFrom(placement.ticket)
                carried = trace.start_generate(placement.worker_id)
                data = stream_bytes(self._connections, placement.address, request, outcome, carried, trace.first_token)
                try:
                    async for piece in data:
                        yield piece
                    return
                except WorkerLost as exc:
                    taken_back = exc.code == FINISH_REVOKED and not outcome.received and revoked < MAX_REVOCATIONS
                    if not taken_back:  # one taken back for a less served tenant is asked again at once
                        log.warning("ingress: request %s: %s", rid, exc.detail)
                        attempt += 1
                        if outcome.received or not exc.retryable or attempt == MAX_PLACEMENTS:
                            raise
                finally:
                    await data.aclose()  # type: ignore[attr-defined]  # client gone: stop the worker at once
                if taken_back:
                    revoked += 1
                else:
                    await asyncio.sleep(0.05 * 2 ** (attempt - 1))
                placement = await self._submit(
                    model,
                    rid,
                    tenant,
                    key_hash,
                    request.prompt_tokens,
                    request.max_tokens,
                    retry=True,
                    tier=placement.service_tier or None,  # the same class as before
                    adapter=served.adapter,
                    shard=placement.shard,  # the shard that placed it holds it
                )
        finally:
            self._release_unstarted(model, rid, outcome)

    def _release_unstarted(self, model: str, rid: str, outcome: Outcome) -> None:
        """Free the reservation of a request given up before its worker sent anything (not awaited:
        this may run while the client leaves; a second call finds nothing to free)."""
        if not outcome.received and not outcome.released:
            outcome.released = True
            self._dispatcher.release(rid, model, outcome.shard)

    # ------------------------------------------------------------------ input

    async def _tenant(self, request: Request) -> str:
        return (await self._caller(request))[0]

    async def _caller(self, request: Request) -> tuple[str, str]:
        """(tenant, key hash) of the request's API key; 401 when the key is unknown."""
        key_hash = self._hasher.of_key(bearer_key(request))
        tenant = await self._owner(key_hash)
        if tenant is None:
            raise ApiError(401, "incorrect API key provided", code="invalid_api_key")
        return tenant, key_hash

    async def _owner(self, key_hash: str) -> str | None:
        """The tenant an API key (by its hash) belongs to (the dispatcher's registry, cached for a few
        seconds)."""
        found, tenant, stale = self._keys.get(key_hash)
        if stale and key_hash not in self._renewing:  # used as it is while renewed, outside the budget
            self._renewing[key_hash] = asyncio.create_task(self._renew_key(key_hash))
        if not found:
            if not self._lookups.take():  # a flood of unknown keys: refused here, the dispatcher spared
                return None
            tenant = await self._dispatcher.lookup_key(key_hash)
            self._keys.put(key_hash, tenant)
        return tenant

    async def _renew_key(self, key_hash: str) -> None:
        try:
            self._keys.put(key_hash, await self._dispatcher.lookup_key(key_hash))
        except Exception:  # the dispatcher restarting: the next request tries again
            log.warning("ingress: renewing a key's answer failed", exc_info=True)
        finally:
            del self._renewing[key_hash]

    async def _admin(self, request: Request) -> None:
        key_hash = self._hasher.of_key(bearer_key(request))
        if is_admin_key(key_hash, self._admin_key_hash):
            return
        if await self._owner(key_hash) is not None:
            raise ApiError(403, "this API key may not use the admin API", type_="permission_error", code="forbidden")
        raise ApiError(401, "incorrect API key provided", code="invalid_api_key")

    async def _json_body(self, request: Request) -> Any:
        return parse_json(await self._raw_body(request))

    async def _raw_body(self, request: Request) -> bytes:
        limit = self._max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
        raw = bytearray()
        try:
            async with asyncio.timeout(self._body_timeout_s):  # a slow upload holds a slot: not for ever
                async for part in request.stream():
                    raw += part
                    if len(raw) > limit:
                        raise ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
        except TimeoutError:
            raise ApiError(
                408,
                f"the request body did not arrive within {self._body_timeout_s:g} s",
                code="request_timeout",
                headers={"Connection": "close"},  # the rest of that body is not waited for either
            ) from None
        return bytes(raw)
