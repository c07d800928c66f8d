"""Schedulers for tests that drive the core event by event."""

from __future__ import annotations

from fairgate.core import FairScheduler, LinearCost, SchedulerConfig


def make(policy: str = "vtc", **kw) -> FairScheduler:
    """A scheduler with the paper's linear cost (w_p = 1, w_q = 2) unless ``cost`` says otherwise."""
    return FairScheduler(SchedulerConfig(policy=policy, **{"cost": LinearCost(1.0, 2.0), **kw}))


def one_running(prompt: int, max_tokens: int, tokens: int, *, exact_prompt: int | None = None) -> FairScheduler:
    """A scheduler whose worker "w" (1,000 KV tokens) runs request "r" of tenant "A": started (with the
    engine's ``exact_prompt`` count when given) and ``tokens`` output tokens reported."""
    s = make()
    s.worker_join("w", kv_tokens=1000)
    s.submit("r", "A", prompt, max_tokens, 0.0)
    s.assign(0.0)
    s.on_report("w", {"r": tokens}, started={"r": prompt if exact_prompt is None else exact_prompt})
    return s
