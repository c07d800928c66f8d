"""vLLM's own OpenAI layer on a fairgate worker: the app ``vllm serve`` builds (chat, completions and
the rest of its serving layer, tool and reasoning parsers and structured outputs as configured), over
the worker's ``AsyncLLM``, driven in-process by the worker for each admitted request.

Its generations pass through ``AccountedEngine``: the engine request takes the admitted request's id
(reports and the dispatcher's aborts find it), its tokens are counted per engine step as they are
generated (non-streaming requests too: vLLM is asked for deltas, gathered into the final output the
serving layer expects), and it gets the tenant's prefix-cache salt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fairgate.workers.engines.interface import current_grant


class AccountedEngine:
    """The engine client vLLM's serving layer sees: ``AsyncLLM`` itself, except that ``generate`` is
    the admitted request's, counted."""

    def __init__(self, runner: Any) -> None:
        self._runner = runner
        self._llm = runner.llm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any) -> AsyncIterator[Any]:
        from vllm.sampling_params import RequestOutputKind

        grant = current_grant.get()
        if grant is None:  # not under a worker's ticket: nothing to account for
            async for out in self._llm.generate(prompt, sampling_params, request_id, **kwargs):
                yield out
            return
        rid = grant.request_id
        if self._runner.kv_keys is not None:  # its KV events name the salt: which group's blocks they are
            self._runner.kv_keys.learn_salt(grant.cache_salt, grant.cache_group)
        wanted = sampling_params.output_kind
        sampling_params.output_kind = RequestOutputKind.DELTA  # every step's tokens, to report them
        self._runner._engine_ids[rid] = request_id
        if self._runner.takes_priority:  # the dispatcher's rank picks the preemption victims
            kwargs["priority"] = grant.priority
        stream = self._llm.generate(prompt, sampling_params, request_id, **kwargs)
        choices = max(1, int(getattr(sampling_params, "n", 1) or 1))
        gathered = None
        async for out in self._runner.tracked(rid, stream, choices):
            if wanted == RequestOutputKind.DELTA:
                yield out
                continue
            if gathered is None:
                gathered = out
            else:
                gathered.add(out, aggregate=True)
            if wanted == RequestOutputKind.CUMULATIVE or out.finished:
                yield gathered


def serve_namespace(settings: Any, served_model: str) -> Any:
    """The arguments ``vllm serve`` would have for these settings: the engine's own, plus ``serve_args``
    (tool and reasoning parsers, chat template options...) exactly as on its command line."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args(settings.serve_cli_args(served_model))
    validate_parsed_serve_args(args)
    return args


async def build_vllm_app(runner: Any) -> Any:
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app

    args = serve_namespace(runner.settings, runner.served_model)
    engine = AccountedEngine(runner)
    tasks = await runner.llm.get_supported_tasks()
    app = build_app(args, tasks, runner.llm.model_config)
    await init_app_state(engine, app.state, args, tasks)
    runner.serving_models = app.state.openai_serving_models  # where the worker registers adapters
    app.user_middleware = [
        m for m in app.user_middleware if getattr(m.cls, "__name__", "") not in SERVER_ONLY_MIDDLEWARE
    ]
    return app


# Middleware of vLLM's app that serves an HTTP server's clients, which the worker's in-process calls do
# not have: CORS answers browsers (the worker's calls carry no Origin), and the HTTP instrumentator
# times requests for a ``/metrics`` the worker does not serve. Both run on every message of every
# stream (7% of the worker replica's CPU in a py-spy profile under load). ``serve_args``' own
# ``--middleware`` and the rest stay.
SERVER_ONLY_MIDDLEWARE = ("CORSMiddleware", "PrometheusInstrumentatorMiddleware")
