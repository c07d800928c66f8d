"""Llama-architecture models that the project builds itself, so the real vLLM path runs anywhere.

No download: the tokenizer is a byte-level BPE trained here with ``tokenizers`` on a small fixed corpus
(deterministic, so the same files come out everywhere), the config is a Llama of a chosen shape, and
vLLM loads it with ``load_format="dummy"`` (random weights, no weight files). The output is gibberish,
but every part of serving is real: tokenizer, chat template, KV cache, batching, step times.

Shapes: ``tiny`` (2 layers, 32-wide heads; runs on a laptop CPU), ``small`` (~100M parameters, for
CPU benchmarks where the model's arithmetic should dominate) and ``llama3-8b`` (Llama-3-8B's layers
and attention, with this small vocabulary; for timing real GPUs without weights).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

VOCAB_SIZE = 512
SHAPES: dict[str, dict[str, int]] = {
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 4096,
    },
    "small": {  # ~100M parameters: steps dominated by the model's arithmetic even on a CPU
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "max_position_embeddings": 4096,
    },
    "llama3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 8192,
    },
}
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|system|>")
# Role markers plus a generation prompt; the ingress applies it through the tokenizer like any model's.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_CORPUS_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have "
    "an they you were her she there been one all we their has would when if so no will can more fair "
    "gate token tokens tenant tenants queue served serve request requests worker workers engine model "
    "prompt output counter virtual batch cache memory replica cluster dispatch latency throughput hello "
    "world question answer write story about explain code python list number first second time day "
    "people water light sound house small large"
)
_BUILD_VERSION = "1"  # bump when the files below change, so cached copies are rebuilt


def default_model_dir(shape: str) -> Path:
    """Where a shape is built: under ``$FAIRGATE_MODEL_CACHE`` or ``~/.cache/fairgate/models``."""
    base = os.environ.get("FAIRGATE_MODEL_CACHE") or Path.home() / ".cache" / "fairgate" / "models"
    return Path(base) / f"{shape}-v{_BUILD_VERSION}"


def ensure_model(shape: str = "tiny", target: Path | None = None) -> Path:
    """Build the model directory once (atomically: concurrent builders never see half a directory)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; known: {', '.join(SHAPES)}")
    target = target or default_model_dir(shape)
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    scratch.mkdir(exist_ok=True)
    _write_tokenizer(scratch, SHAPES[shape]["max_position_embeddings"])
    _write_config(scratch, SHAPES[shape])
    try:
        scratch.rename(target)
    except OSError:  # another process won the race; its copy is identical
        for f in scratch.iterdir():
            f.unlink()
        scratch.rmdir()
    return target


def _corpus() -> list[str]:
    """Deterministic text covering common words, digits and punctuation."""
    lines = []
    words_all = _CORPUS_TEXT.split(" ")
    n = len(words_all)
    for i in range(400):
        words = [words_all[(i * 7 + j * 13) % n] for j in range(12)]
        lines.append(" ".join(words) + f", {i} {i * 31 % 97}. ({words[0]}?) {words[1]}!")
    return lines


def _write_tokenizer(directory: Path, max_length: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "model_max_length": max_length,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (directory / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}, indent=2)
    )


def _write_config(directory: Path, shape: dict[str, int]) -> None:
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        **shape,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": vocab["<|bos|>"],
        "eos_token_id": vocab["<|eos|>"],
        "pad_token_id": vocab["<|pad|>"],
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2))
