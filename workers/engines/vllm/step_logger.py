"""A vLLM stat logger that tells the runner, once per engine step, what the scheduler looks like now."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

# (free KV fraction, running requests, waiting requests, the LoRA adapters of the running batch)
StepListener = Callable[[float, int, int, tuple[str, ...]], None]


class StepLogger(StatLoggerBase):
    def __init__(self, on_step: StepListener) -> None:  # vLLM's (config, engine index) are bound by the runner
        self._on_step = on_step

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self._on_step(
                1.0 - float(scheduler_stats.kv_cache_usage),
                int(scheduler_stats.num_running_reqs),
                int(scheduler_stats.num_waiting_reqs),
                tuple(name for name, n in scheduler_stats.running_lora_adapters.items() if n),
            )

    def log_engine_initialized(self) -> None:
        pass
