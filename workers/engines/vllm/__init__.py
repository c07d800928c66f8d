"""vLLM behind the worker interface: its settings (``settings``), the runner over ``AsyncLLM``
(``runner``, per-step reports from a stat logger), the model's tokenizer and chat template at the
ingress (``prompts``), the models the project builds itself (``local_models``) and the profiler.
Importing this package does not import vLLM; only starting a runner does."""

from fairgate.workers.engines.vllm.plugin import VllmPlugin

__all__ = ["VllmPlugin"]
