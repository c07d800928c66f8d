"""The simulated engine's settings: the ``workers`` section's ``kv_tokens``, ``block_size``,
``max_running``, ``prefix_caching``, ``preempt_by`` (``priority``: the dispatcher's ranks choose the
preemption victims; ``newest``: vLLM's default), ``watermark`` (the KV fraction kept free when
admitting), ``max_loras`` and ``max_cpu_loras`` (LoRA adapter slots on the GPU and in host memory, as
vLLM's flags of those names; none: the engine serves no adapters) and ``step_model`` (a preset name,
``a10g-llama7b`` or ``h200-llama3-8b``, or the model's coefficients)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fairgate.workers.engines.simulated.adapters import AdapterSettings
from fairgate.workers.engines.simulated.steptime import StepTimeModel

STEP_PRESETS = {"a10g-llama7b": StepTimeModel.a10g_llama7b, "h200-llama3-8b": StepTimeModel.h200_llama3_8b}


class SimulatedSettings(BaseModel):
    """The simulated engine: continuous batching over a KV pool, with a prefix cache and step times
    from a profile."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    kv_tokens: int = Field(10_000, ge=1, description="the KV pool, in tokens")
    block_size: int = Field(16, ge=1, description="tokens per KV block")
    max_running: int | None = Field(None, ge=1, description="batch limit (none: the pool decides)")
    prefix_caching: bool = Field(True, description="whether it keeps and reuses cached prompt blocks")
    preempt_by: Literal["newest", "priority"] = Field(
        "priority", description="preemption victims: the dispatcher's ranks, or the newest (vLLM's default)"
    )
    watermark: float = Field(0.0, ge=0.0, lt=1.0, description="share of the pool kept free when admitting")
    max_loras: int | None = Field(None, ge=1, description="adapters a batch holds at once (none: no adapters)")
    max_cpu_loras: int | None = Field(None, ge=1, description="adapters kept in host memory (none: 4x max_loras)")
    step_model: dict[str, float] = Field(
        default_factory=lambda: StepTimeModel.a10g_llama7b().to_dict(),
        description="a10g-llama7b, h200-llama3-8b or the step-time coefficients",
    )

    def adapter_settings(self) -> AdapterSettings | None:
        if self.max_loras is None:
            return None
        return AdapterSettings(self.max_loras, self.max_cpu_loras or 4 * self.max_loras)

    @field_validator("step_model", mode="before")
    @classmethod
    def _step_model(cls, value: Any) -> Any:
        if isinstance(value, str) and value in STEP_PRESETS:
            return STEP_PRESETS[value]().to_dict()
        if not isinstance(value, dict):
            raise ValueError(f"must be one of {', '.join(STEP_PRESETS)} or a mapping of coefficients")
        try:
            return StepTimeModel(**{k: float(v) for k, v in value.items()}).to_dict()
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc)) from None
