"""The OpenAI-compatible ingress: a Ray Serve FastAPI deployment, stateless, any number of replicas.

Per request: identify the tenant from its API key (and nothing else), count prompt tokens with the
engine's tokenizer, submit the metadata to the dispatcher, then stream from the assigned worker
straight to the client. A client that disconnects while queued withdraws its request; one that
disconnects while streaming aborts it at the worker.
"""

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import RayActorError

from common.config import hash_key
from common.rpc import fairgate_pb2 as pb
from common.tickets import TicketFields, ticket_message
from common.tracing import RequestTrace, configure_tracing, finished_spans
from dispatcher.actor import get_or_create_dispatcher
from ingress.admin_api import tenant_change
from ingress.auth import KeyCache, LookupBudget, bearer_key, is_admin_key
from ingress.errors import rejection_error
from ingress.generation import Outcome, WorkerChannels, WorkerLost, stream_text
from ingress.openai_api import ApiError, ChatRequest, CompletionRequest, parse_body, parse_json
from ingress.prometheus import CONTENT_TYPE, render_prometheus
from ingress.prompting import Prompting
from ingress.responses import sse_events, whole_response

app = FastAPI(title="fairgate", version="0.1.0")

DASHBOARD_HTML = resources.files("ingress").joinpath("dashboard.html").read_text()
DASHBOARD_HISTORY_S = 300.0  # the live page's chart: the last five minutes
DISPATCHER_WAIT_S = 60.0  # how long a request waits for a restarting dispatcher
MAX_PLACEMENTS = 5  # placements of one request whose workers were lost before its first token


INLINE_TOKENIZE_BYTES = 16_384  # larger bodies are tokenized off the event loop (it serves every client)
log = logging.getLogger(__name__)


# defined before the deployment class: Serve serializes the class when it is decorated
def _ticket(placement: dict[str, Any]) -> pb.Ticket:
    return ticket_message(TicketFields(**placement["ticket"]), placement["signature"])


def _generate_request(req: ChatRequest | CompletionRequest, prompt: str, prompt_tokens: int, max_tokens: int):
    """The worker's request, built and encoded before anything is reserved: a value that cannot travel
    is the client's 400, never a failure after the dispatcher assigned it."""
    chat = isinstance(req, ChatRequest)
    try:
        message = pb.GenerateRequest(
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed or 0,
            has_seed=req.seed is not None,
            stop=req.stop_strings(),
            ignore_eos=req.ignore_eos,
            templated=chat,
            final_only=not req.stream and not req.stop_strings(),  # one message instead of one per step
        )
        message.SerializeToString()
    except (ValueError, TypeError, OverflowError) as exc:
        raise ApiError(400, f"the request has a value that cannot be encoded ({type(exc).__name__})") from None
    return message


@app.exception_handler(ApiError)
async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    return exc.response()


@app.exception_handler(Exception)
async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    """A bug must not show its insides to clients: the details go to the log only."""
    log.error("ingress: unexpected %s", type(exc).__name__, exc_info=exc)
    return ApiError(500, "the gateway failed on this request", type_="server_error", code="internal_error").response()


@serve.deployment(
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=10_000,
    logging_config={"enable_access_log": False, "log_level": "WARNING"},
)
@serve.ingress(app)
class Ingress:
    def __init__(self, app_name: str, gateway: dict[str, Any], secret: str, workers: Any = None) -> None:
        configure_tracing(gateway.get("telemetry"), "fairgate-ingress")
        self._model = gateway["model"]
        self._max_body_bytes = int(gateway["ingress"]["max_body_bytes"])
        self._prompting = Prompting(gateway)
        self._keys = KeyCache({t["key_hash"]: t["name"] for t in gateway["tenants"]})
        self._lookups = LookupBudget()
        self._admin_key_hash = gateway.get("admin_key_hash", "")
        self._dispatcher = get_or_create_dispatcher(app_name, gateway, secret)
        self._channels = WorkerChannels()
        self._workers = workers  # the worker deployment, bound so that Serve runs it with this app
        self._top_tenants = int(gateway.get("telemetry", {}).get("top_tenants", 20))
        self._snapshot: tuple[float, dict[str, Any]] | None = None

    # ------------------------------------------------------------------ routes

    @app.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(self, request: Request) -> dict[str, Any]:
        await self._tenant(request)
        return {
            "object": "list",
            "data": [{"id": self._model, "object": "model", "created": 0, "owned_by": "fairgate"}],
        }

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._serve(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self._serve(request, chat=True)

    # ------------------------------------------------------------------ observability

    @app.get("/metrics")
    async def metrics(self, request: Request) -> Response:
        """Prometheus exposition of the dispatcher's figures. Per-tenant series (capped at top_tenants)
        only for a scrape with the admin key: tenants' names and usage are nobody else's business; an
        anonymous scrape gets every figure summed over tenants (``tenant="other"``)."""
        key = request.headers.get("authorization", "").partition(" ")[2].strip()
        top = self._top_tenants if key and is_admin_key(key, self._admin_key_hash) else 0
        snapshot = await self._telemetry()
        return Response(render_prometheus(snapshot, top), media_type=CONTENT_TYPE)

    @app.get("/dashboard")
    async def dashboard(self) -> HTMLResponse:
        """The live page; it asks for the admin key and reads /admin/dashboard.json with it."""
        return HTMLResponse(DASHBOARD_HTML)

    @app.get("/admin/dashboard.json")
    async def dashboard_data(self, request: Request) -> dict[str, Any]:
        await self._admin(request)
        return await self._ask_dispatcher("telemetry", (DASHBOARD_HISTORY_S,))

    async def finished_spans(self) -> list[dict[str, Any]]:
        """Spans finished in this replica (telemetry traces: memory; called through a Serve handle)."""
        return finished_spans()

    async def _telemetry(self) -> dict[str, Any]:
        """The dispatcher's telemetry snapshot, shared by scrapes within a second."""
        now = time.monotonic()
        if self._snapshot is None or now - self._snapshot[0] > 1.0:
            self._snapshot = (now, await self._ask_dispatcher("telemetry", ()))
        return self._snapshot[1]

    # ------------------------------------------------------------------ admin API (admin key only)

    @app.get("/admin/tenants")
    async def admin_list(self, request: Request) -> dict[str, Any]:
        await self._admin(request)
        return {"object": "list", "data": await self._dispatcher.list_tenants.remote()}

    @app.post("/admin/tenants", status_code=201)
    async def admin_create(self, request: Request) -> dict[str, Any]:
        await self._admin(request)
        name, weight, key = tenant_change(await self._json_body(request), creating=True)
        row = await self._change("create", name or "", key, weight)
        return {**row, "api_key": key}  # shown once: only its hash is kept

    @app.patch("/admin/tenants/{name}")
    async def admin_update(self, name: str, request: Request) -> dict[str, Any]:
        await self._admin(request)
        _, weight, key = tenant_change(await self._json_body(request), creating=False)
        return await self._change("update", name, key, weight)

    @app.delete("/admin/tenants/{name}")
    async def admin_delete(self, name: str, request: Request) -> dict[str, Any]:
        await self._admin(request)
        return await self._change("delete", name, None, None)

    @app.get("/admin/stats")
    async def admin_stats(self, request: Request) -> dict[str, Any]:
        await self._admin(request)
        return await self._dispatcher.stats.remote()

    async def _change(self, action: str, name: str, key: str | None, weight: float | None) -> dict[str, Any]:
        key_hash = None if key is None else hash_key(key)
        result = await self._dispatcher.change_tenant.remote(action, name, key_hash, weight)
        if "error" in result:
            status, message = result["error"]
            raise ApiError(status, message, code={404: "not_found", 409: "conflict"}.get(status, "invalid_request"))
        self._keys.forget_tenant(name)
        return result

    # ------------------------------------------------------------------ one request

    async def _serve(self, request: Request, chat: bool):
        tenant, key_hash = await self._caller(request)
        body = await self._json_body(request)
        req = parse_body(ChatRequest if chat else CompletionRequest, body)
        if req.model != self._model:
            raise ApiError(404, f"the model '{req.model}' does not exist", param="model", code="model_not_found")
        if request.state.body_bytes > INLINE_TOKENIZE_BYTES:  # long prompts: tokenized off the event loop
            prompt, prompt_tokens, max_tokens = await asyncio.to_thread(self._prompting.prepare, req)
        else:
            prompt, prompt_tokens, max_tokens = self._prompting.prepare(req)
        grpc_request = _generate_request(req, prompt, prompt_tokens, max_tokens)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        trace = RequestTrace(
            {
                "fairgate.request_id": rid,
                "fairgate.tenant": tenant,
                "fairgate.model": self._model,
                "fairgate.stream": bool(req.stream),
                "fairgate.prompt_tokens": prompt_tokens,
                "fairgate.max_tokens": max_tokens,
            }
        )
        try:
            with trace.queue_span() as queue:
                placement = await self._submit(rid, tenant, key_hash, prompt_tokens, max_tokens)
                trace.dispatched(queue, placement)
        except BaseException as exc:
            trace.finish(prompt_tokens, 0, None, error=type(exc).__name__)
            raise
        outcome = Outcome()
        text = self._generate(tenant, key_hash, placement, grpc_request, req.stop_strings(), outcome, trace)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        if req.stream:
            release = functools.partial(self._release_unstarted, rid, outcome)
            events = sse_events(rid, chat, self._model, text, outcome, include_usage, trace, release)
            return StreamingResponse(events, media_type="text/event-stream")
        error = ""
        try:
            content = "".join([piece async for piece in text])
        except WorkerLost as exc:
            error = "worker_failed"
            raise ApiError(502, str(exc), type_="server_error", code="worker_failed") from None
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            await text.aclose()  # type: ignore[attr-defined]  # client gone: stop the worker at once
            trace.finish(outcome.prompt_tokens, outcome.completion_tokens, outcome.finish_reason, error)
        return whole_response(rid, chat, self._model, content, outcome)

    async def _submit(
        self, rid: str, tenant: str, key_hash: str, prompt_tokens: int, max_tokens: int, retry: bool = False
    ) -> dict[str, Any]:
        """Queue the request; returns its placement. Asked again after a dispatcher restart with the
        same id and ``retry`` set, so it never runs twice. The dispatcher checks the key again."""
        args = (rid, tenant, prompt_tokens, max_tokens)
        placement = await self._ask_dispatcher("submit", (*args, retry, key_hash), again=(*args, True, key_hash))
        if "rejected" in placement:
            raise rejection_error(placement["rejected"])
        return placement

    async def _ask_dispatcher(self, method: str, args: tuple[Any, ...], again: tuple[Any, ...] | None = None) -> Any:
        """Call the dispatcher, waiting out a restart (up to ``DISPATCHER_WAIT_S``) and asking again with
        ``again`` (default: the same arguments). Cancelling the call cancels it at the dispatcher."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DISPATCHER_WAIT_S
        delay = 0.1
        while True:
            ref = getattr(self._dispatcher, method).remote(*args)
            try:
                return await ref
            except asyncio.CancelledError:  # e.g. the client left while queued: withdraw the request
                ray.cancel(ref)
                raise
            except RayActorError:
                if loop.time() >= deadline:
                    raise rejection_error("dispatcher_unavailable") from None
                args = again or args
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)

    async def _generate(
        self,
        tenant: str,
        key_hash: str,
        placement: dict[str, Any],
        request: pb.GenerateRequest,
        stops: list[str],
        outcome: Outcome,
        trace: RequestTrace,
    ) -> AsyncIterator[str]:
        """Stream the text from the assigned worker. A worker lost before it sent anything (crashed,
        unreachable, ticket refused): the dispatcher places the request again, same id, at the head of
        its tenant's queue. Once anything arrived, a lost worker ends the request with an error. However
        it ends before its worker sent anything (a failure, the client leaving), its reservation is
        freed at once: no one waits for its ticket to expire."""
        rid = placement["ticket"]["request_id"]
        try:
            for attempt in range(MAX_PLACEMENTS):
                request.ticket.CopyFrom(_ticket(placement))
                metadata = trace.start_generate(placement["worker_id"])
                text = stream_text(
                    self._channels, placement["address"], request, stops, outcome, metadata, trace.first_token
                )
                try:
                    async for piece in text:
                        yield piece
                    return
                except WorkerLost as exc:
                    log.warning("ingress: request %s: %s", rid, exc.detail)
                    if outcome.received or not exc.retryable or attempt + 1 == MAX_PLACEMENTS:
                        raise
                finally:
                    await text.aclose()  # type: ignore[attr-defined]  # client gone: stop the worker at once
                await asyncio.sleep(0.05 * 2**attempt)
                placement = await self._submit(
                    rid, tenant, key_hash, request.prompt_tokens, request.max_tokens, retry=True
                )
        finally:
            self._release_unstarted(rid, outcome)

    def _release_unstarted(self, rid: str, outcome: Outcome) -> None:
        """Free the reservation of a request given up before its worker sent anything (not awaited:
        this may run while the client leaves; a second call finds nothing to free)."""
        if not outcome.received and not outcome.released:
            outcome.released = True
            self._dispatcher.release.remote(rid)

    # ------------------------------------------------------------------ input

    async def _tenant(self, request: Request) -> str:
        return (await self._caller(request))[0]

    async def _caller(self, request: Request) -> tuple[str, str]:
        """(tenant, key hash) of the request's API key; 401 when the key is unknown."""
        key = bearer_key(request)
        tenant = await self._owner(key)
        if tenant is None:
            raise ApiError(401, "incorrect API key provided", code="invalid_api_key")
        return tenant, hash_key(key)

    async def _owner(self, key: str) -> str | None:
        """The tenant an API key belongs to (the dispatcher's registry, cached for a few seconds)."""
        key_hash = hash_key(key)
        found, tenant = self._keys.get(key_hash)
        if not found:
            if not self._lookups.take():  # a flood of unknown keys: refused here, the dispatcher spared
                return None
            tenant = await self._ask_dispatcher("lookup_key", (key_hash,))
            self._keys.put(key_hash, tenant)
        return tenant

    async def _admin(self, request: Request) -> None:
        key = bearer_key(request)
        if is_admin_key(key, self._admin_key_hash):
            return
        if await self._owner(key) is not None:
            raise ApiError(403, "this API key may not use the admin API", type_="permission_error", code="forbidden")
        raise ApiError(401, "incorrect API key provided", code="invalid_api_key")

    async def _json_body(self, request: Request) -> Any:
        limit = self._max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > limit:
                raise ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
        request.state.body_bytes = len(raw)
        return parse_json(bytes(raw))
