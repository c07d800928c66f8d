"""The vLLM runner on CPU, with the project's tiny model: per-step reports against vLLM's own KV
accounting, exact prompt counts, abort, and a measured profile that drives the simulator. One engine
for the module (starting one takes ~30 s here)."""

from __future__ import annotations

import asyncio
import contextlib
import gc

import pytest

from fairgate.core import fit_profiled_cost
from fairgate.loadgen.benches.engine_model import compare, workload
from fairgate.loadgen.simulator import SimulationConfig, simulate
from fairgate.workers.engines.interface import GenerationParams, StepReport
from fairgate.workers.engines.simulated import StepTimeModel
from fairgate.workers.engines.vllm.profiler import average_profiles, profile
from fairgate.workers.engines.vllm.prompts import HuggingFacePrompts
from fairgate.workers.engines.vllm.runner import VllmRunner
from fairgate.workers.engines.vllm.settings import VllmSettings

pytestmark = pytest.mark.slow

KV_TOKENS = 4096
BLOCK = 32
MAX_NUM_SEQS = 16


class Engine:
    """A started runner on its own event loop, with every report it produced."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.runner = VllmRunner(
            VllmSettings(model="tiny", kv_tokens=KV_TOKENS, block_size=BLOCK, max_num_seqs=MAX_NUM_SEQS, cpu_threads=1)
        )
        self.reports: list[StepReport] = []
        self.loop.run_until_complete(self.runner.start(self.reports.append))

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    async def collect(self, request_id: str, params: GenerationParams, stop_after: int | None = None):
        deltas = []
        gen = self.runner.generate(request_id, params)
        try:
            async for d in gen:
                deltas.append(d)
                if stop_after is not None and d.completion_tokens >= stop_after:
                    break
        finally:
            await gen.aclose()
        return deltas

    async def settle(self) -> None:
        """Let the last step's report go out."""
        for _ in range(50):
            await asyncio.sleep(0.02)
            if not self.runner.has_work():
                await asyncio.sleep(0.05)
                return


@pytest.fixture(scope="module")
def engine():
    # vLLM's front end runs in this process; after the rest of the suite its heap is large, and the
    # cyclic GC's pauses would slow the engine during some measurements and not others.
    gc.freeze()
    e = Engine()
    yield e
    e.run(e.runner.stop())
    e.loop.close()
    gc.unfreeze()


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK)


def test_pool_comes_from_vllm(engine):
    assert engine.runner.kv_tokens == KV_TOKENS
    assert engine.runner.block_size == BLOCK
    assert engine.runner.free_tokens() == KV_TOKENS
    assert engine.runner.max_running == MAX_NUM_SEQS


def test_a_first_request_of_two_tokens_leaves_the_engine_alive(engine):
    """The module's first generation (keep it first): vLLM's CPU backend killed its model process on a
    first forward pass of a few tokens (SIGILL), and every request after it failed; the runner warms
    the engine up with a longer prompt when it starts."""
    deltas = engine.run(engine.collect("tiny-first", GenerationParams([1, 2], max_tokens=3, ignore_eos=True)))
    assert deltas[-1].completion_tokens == 3 and deltas[-1].finish_reason == "length"
    assert engine.runner.healthy()


def test_reports_match_vllm_kv_use_within_one_block_per_request(engine):
    """Replaying the reports as the dispatcher does (prompt + tokens so far per running request)
    predicts vLLM's free KV after every step within one block per running request."""
    engine.reports.clear()
    prompts = ["the tenant queue is served " * n for n in (1, 3, 6, 9, 12, 15)]

    async def many():
        return await asyncio.gather(
            *(
                engine.collect(f"kv-{i}", GenerationParams(p, max_tokens=60 + 10 * i, ignore_eos=True, seed=i))
                for i, p in enumerate(prompts)
            )
        )

    results = engine.run(many())
    engine.run(engine.settle())
    contexts: dict[str, int] = {}
    totals: dict[str, int] = {}
    checked = 0
    for report in engine.reports:
        for rid, prompt_tokens in report.started.items():
            contexts[rid] = prompt_tokens
        for rid, k in report.new_tokens.items():
            contexts[rid] += k
            totals[rid] = totals.get(rid, 0) + k
        for done in report.finished:
            contexts.pop(done.id)
        predicted_free = KV_TOKENS - sum(_blocks(c) * BLOCK for c in contexts.values())
        assert abs(predicted_free - report.free_tokens) <= BLOCK * max(1, len(contexts)), report
        checked += 1
    assert checked >= 60  # one report per step: at least as many as the longest request's tokens
    assert not contexts
    assert engine.reports[-1].free_tokens == KV_TOKENS
    for i, deltas in enumerate(results):
        assert deltas[-1].finish_reason == "length"
        assert deltas[-1].completion_tokens == 60 + 10 * i == totals[f"kv-{i}"]


def test_prompt_counts_are_exact_for_completions_and_chat(engine):
    """The ingress's count (the model's tokenizer) equals what the engine reports as started."""
    prompts = HuggingFacePrompts(engine.runner.settings.model_path())
    chat = prompts.chat_prompt([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}])
    cases = [("plain", "write a story about the cluster", False), ("chat", chat, True)]
    engine.reports.clear()
    for rid, text, templated in cases:
        deltas = engine.run(engine.collect(rid, GenerationParams(text, max_tokens=3, templated=templated)))
        assert deltas[-1].prompt_tokens == prompts.count(text, templated)
    engine.run(engine.settle())
    started = {rid: n for r in engine.reports for rid, n in r.started.items()}
    assert started == {rid: prompts.count(text, t) for rid, text, t in cases}
    assert chat.startswith("<|bos|><|system|>be brief")


def test_abort_frees_kv_space_in_vllm(engine):
    """Closing a stream aborts the request in vLLM: its blocks are free again by the next step."""
    engine.reports.clear()
    deltas = engine.run(
        engine.collect("long", GenerationParams("hello world " * 40, max_tokens=900, ignore_eos=True), stop_after=20)
    )
    assert deltas[-1].completion_tokens < 900
    engine.run(engine.settle())
    aborted = [f for r in engine.reports for f in r.finished if f.id == "long"]
    assert [f.reason for f in aborted] == ["abort"]
    assert not engine.runner.has_work()
    engine.reports.clear()
    # vLLM's own usage, not the idle shortcut: one new short request occupies just its own blocks
    engine.run(engine.collect("after", GenerationParams("hello", max_tokens=5, ignore_eos=True)))
    engine.run(engine.settle())
    busy = [r for r in engine.reports if r.running]
    assert busy and all(r.free_tokens >= KV_TOKENS - 2 * BLOCK for r in busy)


def test_dispatcher_abort_ends_the_stream_with_abort(engine):
    async def abort_midway():
        gen = engine.runner.generate("cut", GenerationParams("hello", max_tokens=500, ignore_eos=True))
        seen = []
        async for d in gen:
            if d.completion_tokens >= 5 and not any(s.completion_tokens >= 5 for s in seen):
                engine.runner.abort("cut")
            seen.append(d)
        return seen

    seen = engine.run(abort_midway())
    assert seen[-1].finish_reason == "abort"
    assert seen[-1].completion_tokens < 500


def test_a_measured_profile_fits_the_simulated_engine_and_drives_the_simulator(engine):
    """``fairgate profile``'s measurement: every cell positive, accepted by VTC's profiled cost, fitted
    by the simulated engine, which then runs a workload. How close its throughput comes to vLLM's is
    measured by ``fairgate bench engine-model`` (a speed figure, not a test's)."""
    grid = {"inputs": (16, 64, 160), "outputs": (1, 32)}  # six points: enough to fit h
    measured = engine.run(profile(engine.runner, **grid))
    for by_output in measured.values():
        for batch, prefill_s, decode_s in by_output.values():
            assert 1 <= batch <= MAX_NUM_SEQS and prefill_s > 0 and decode_s >= 0
    assert fit_profiled_cost(measured).total(64, 32) > 0  # VTC's profiled cost accepts it too
    step_model = StepTimeModel.from_profile(average_profiles(measured, measured))
    config = SimulationConfig(kv_tokens=KV_TOKENS, step_model=step_model, block_size=BLOCK, max_running=MAX_NUM_SEQS)
    assert simulate(workload("mixed", 4.0), config).report["output_tokens"] > 0


def test_under_kv_pressure_vllm_holds_requests_waiting_and_the_bench_compares_it_with_the_model(engine):
    """The KV-bound case of ``fairgate bench engine-model``, one short trial: as many requests as vLLM's
    batch limit whose outputs outgrow its pool; vLLM admits by the prompt and preempts, so its reports
    show requests waiting inside it while it held no more than its batch limit, and the simulated
    engine given its rule and watermark runs the same workload."""
    (trial,) = compare(engine.run, engine.runner, engine.reports, "kv-bound", 6.0, 1)
    assert trial.real > 0 and trial.simulated > 0
    assert trial.waited > 0


def test_a_caller_leaving_after_the_prefill_began_leaves_the_prompt_charged(engine):
    """The client left after the engine scheduled its request but before any output token reached the
    worker (e.g. right after the first SSE chunk, which carries only the role): the runner still
    reports it started with its prompt, so the dispatcher does not refund a prefill the GPU did."""
    engine.reports.clear()
    prompt = "hello world " * 300

    async def leave_once_scheduled():
        gen = engine.runner.generate("gone", GenerationParams(prompt, max_tokens=50, ignore_eos=True))
        first = asyncio.ensure_future(anext(gen))
        while not engine.runner.scheduled_prompt_tokens("gone") and not first.done():
            await asyncio.sleep(0.001)
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await first
        await gen.aclose()

    engine.run(leave_once_scheduled())
    engine.run(engine.settle())
    started = {rid: n for r in engine.reports for rid, n in r.started.items()}
    finished = [f for r in engine.reports for f in r.finished if f.id == "gone"]
    assert started.get("gone", 0) > 500  # the prompt's exact tokens
    assert [f.reason for f in finished] == ["abort"]


def test_the_workers_openai_layer_leaves_out_only_the_http_servers_middleware(engine):
    """vLLM's app, as the worker drives it in-process: no CORS and no HTTP instrumentator (they serve a
    server's clients, and cost CPU on every message of every stream), its other middleware kept, and
    it answers."""
    from fairgate.workers.asgi_call import call_asgi
    from fairgate.workers.engines.vllm.openai_layer import SERVER_ONLY_MIDDLEWARE

    app = engine.run(engine.runner.openai_app())
    names = [m.cls.__name__ for m in app.user_middleware]
    assert "ScalingMiddleware" in names and not set(names) & set(SERVER_ONLY_MIDDLEWARE), names

    async def ask():
        body = b'{"model": "tiny", "prompt": "hello", "max_tokens": 3, "ignore_eos": true}'
        response = await call_asgi(app, "/v1/completions", body, {"content-type": "application/json"})
        return response.status, b"".join([piece async for piece in response.body])

    status, text = engine.run(ask())
    assert status == 200 and b'"completion_tokens":3' in text, text
