"""Small LoRA adapters for the project's local models, made here with ``peft``: random weights (both
LoRA matrices, so the adapter changes the output), saved as ``peft`` saves any adapter. Nothing is
downloaded."""

from __future__ import annotations

from pathlib import Path


def make_adapter(model_dir: str, target: Path, seed: int, rank: int = 8) -> Path:
    """An adapter of ``rank`` on the attention projections of the model at ``model_dir``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, LlamaForCausalLM

    if (target / "adapter_config.json").exists():
        return target
    torch.manual_seed(seed)
    base = LlamaForCausalLM(AutoConfig.from_pretrained(model_dir))
    lora = LoraConfig(
        r=rank,
        lora_alpha=128 * rank,  # strong: the dummy base model's logits are nearly flat
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=False,  # random A and B: not a no-op
        task_type="CAUSAL_LM",
    )
    get_peft_model(base, lora).save_pretrained(str(target))
    return target
