"""The simulated engine's own OpenAI layer: chat and text completions (one choice, text only, stop
strings, streaming with usage) served over the runner, as vLLM's serving layer is served over its
engine. The worker drives it in-process for each admitted request; the request id comes from the
ticket's grant (``current_grant``), never from the body."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from fairgate.common.openai_errors import ApiError, parse_body
from fairgate.workers.engines.interface import Delta, GenerationParams, current_grant
from fairgate.workers.engines.simulated.prompts import SimulatedPrompts
from fairgate.workers.engines.simulated.protocol import ChatRequest, CompletionRequest
from fairgate.workers.engines.simulated.responses import (
    chat_chunk,
    completion_chunk,
    envelope,
    now_s,
    sse,
    usage,
    whole_response,
)


class StopScanner:
    """Cuts generated text at the first stop string, holding back what could still begin one."""

    def __init__(self, stops: list[str]) -> None:
        self._stops = stops
        self._keep = max((len(s) for s in stops), default=1) - 1
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The text that is safe to send now."""
        self._held += text
        cut = min((i for i in (self._held.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self._held = self._held[:cut], ""
            return out
        safe = len(self._held) - self._keep
        if safe <= 0:
            return ""
        out, self._held = self._held[:safe], self._held[safe:]
        return out

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out


def build_openai_app(runner: Any, default_max_tokens: int = 256) -> FastAPI:
    """The layer over ``runner`` (a ``SimulatedRunner``)."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    prompts = SimulatedPrompts()

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    async def serve(request: Request, chat: bool):
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
        req = parse_body(ChatRequest if chat else CompletionRequest, body)
        grant = current_grant.get()
        rid = grant.request_id if grant is not None else "cmpl-" + uuid.uuid4().hex  # served alone
        prompt = prompts.chat_prompt(req.message_dicts()) if chat else req.prompt_text()
        max_tokens = (req.max_completion_tokens if chat else None) or req.max_tokens or default_max_tokens
        params = GenerationParams(
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            stop=tuple(req.stop_strings()),
            ignore_eos=req.ignore_eos,
            templated=chat,
            cache_salt=grant.cache_salt if grant is not None else str(body.get("cache_salt") or ""),
            priority=grant.priority if grant is not None else 0,
            adapter=grant.adapter if grant is not None else "",
            cache_group=grant.cache_group if grant is not None else "",
        )
        deltas = runner.generate(rid, params)
        stops = StopScanner(req.stop_strings())
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                _events(rid, chat, req.model, deltas, stops, include_usage), media_type="text/event-stream"
            )
        text: list[str] = []
        last = Delta("", 0, 0)
        finish = None
        try:
            async for delta in deltas:
                last = delta
                text.append(stops.feed(delta.text))
                if stops.stopped or delta.finish_reason:
                    finish = "stop" if stops.stopped else delta.finish_reason
                    break
        finally:
            await deltas.aclose()  # type: ignore[attr-defined]
        text.append("" if stops.stopped else stops.flush())
        content = "".join(text)
        return whole_response(
            rid, chat, req.model, content, finish, last.prompt_tokens, last.completion_tokens, last.cached_tokens
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serve(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serve(request, chat=False)

    return app


async def _events(
    rid: str, chat: bool, model: str, deltas: AsyncIterator[Delta], stops: StopScanner, include_usage: bool
) -> AsyncIterator[str]:
    """Server-sent events: a chunk per engine step, the finish reason, usage when asked for, [DONE]."""
    created = now_s()

    def piece(text: str, finish: str | None) -> str:
        if chat:
            return sse(chat_chunk(rid, model, created, {"content": text} if text or not finish else {}, finish))
        return sse(completion_chunk(rid, model, created, text, finish))

    last = Delta("", 0, 0)
    finish = None
    try:
        first = True
        async for delta in deltas:
            last = delta
            if first and chat:
                yield sse(chat_chunk(rid, model, created, {"role": "assistant", "content": ""}, None))
            first = False
            text = stops.feed(delta.text)
            if stops.stopped or delta.finish_reason:
                text += "" if stops.stopped else stops.flush()
                finish = "stop" if stops.stopped else delta.finish_reason
                if text:
                    yield piece(text, None)
                break
            if text:
                yield piece(text, None)
    finally:
        await deltas.aclose()  # type: ignore[attr-defined]  # the client left: the engine aborts it
    yield piece("", finish)
    if include_usage:
        obj = "chat.completion.chunk" if chat else "text_completion"
        tokens = usage(last.prompt_tokens, last.completion_tokens, last.cached_tokens)
        yield sse(envelope(rid, obj, model, created, [], usage=tokens))
    yield "data: [DONE]\n\n"
