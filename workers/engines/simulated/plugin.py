"""The simulated engine as a plug-in: the default, needing nothing but this package."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairgate.common.sections import validate_section
from fairgate.workers.engines import register
from fairgate.workers.engines.interface import EnginePlugin, EngineRunner, PromptEstimator, Settings
from fairgate.workers.engines.simulated.settings import SimulatedSettings


@register
class SimulatedPlugin(EnginePlugin):
    """The simulated engine (the default): continuous batching over a KV pool with modelled step times,
    a prefix cache and its tiers, LoRA adapters; needs nothing but this package."""

    name = "simulated"
    settings_model = SimulatedSettings

    def settings(self, raw: Mapping[str, Any]) -> Settings:
        return validate_section(SimulatedSettings, dict(raw), "workers").model_dump()

    def override(self, settings: Settings, *, model: str | None = None, kv_tokens: int | None = None) -> Settings:
        if kv_tokens is not None:
            settings = {**settings, "kv_tokens": kv_tokens}
        return self.settings(settings)

    def runner(self, settings: Settings, served_model: str | None = None) -> EngineRunner:
        from fairgate.workers.engines.simulated.model import SimulatedEngine
        from fairgate.workers.engines.simulated.runner import SimulatedRunner
        from fairgate.workers.engines.simulated.steptime import StepTimeModel

        s = SimulatedSettings.model_validate(settings)
        engine = SimulatedEngine(
            s.kv_tokens,
            StepTimeModel(**s.step_model),
            block_size=s.block_size,
            max_running=s.max_running,
            prefix_caching=s.prefix_caching,
            preempt_by=s.preempt_by,
            watermark=s.watermark,
            adapters=s.adapter_settings(),
            kv_events=s.prefix_caching,  # forwarded in the dispatcher's keys (``SimulatedRunner``)
        )
        return SimulatedRunner(engine, served_model or "")

    def prompts(self, settings: Settings) -> PromptEstimator:
        from fairgate.workers.engines.simulated.prompts import SimulatedPrompts

        return SimulatedPrompts()

    def benchmark_settings(self, options: Mapping[str, Any]) -> tuple[Settings, str]:
        step = {"step_overhead_s": float(options.get("step_ms") or 1.0) / 1000, "prefill_per_token_s": 0.0}
        step |= {"decode_per_seq_s": 0.0, "decode_per_ctx_token_s": 0.0}
        return {"kv_tokens": options.get("kv_tokens") or 1_000_000, "block_size": 1, "step_model": step}, "fairgate-sim"

    def serves_adapters(self, settings: Settings) -> bool:
        return SimulatedSettings.model_validate(settings).max_loras is not None

    def capacity(self, settings: Settings) -> tuple[int, int | None]:
        s = SimulatedSettings.model_validate(settings)
        return s.kv_tokens, s.max_running

    def block_size(self, settings: Settings) -> int:
        return SimulatedSettings.model_validate(settings).block_size
