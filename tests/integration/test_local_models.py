"""The models the project builds for itself: deterministic files, a usable tokenizer and template."""

from __future__ import annotations

import json

import pytest

from fairgate.workers.engines.vllm.local_models import SHAPES, VOCAB_SIZE, ensure_model
from fairgate.workers.engines.vllm.prompts import HuggingFacePrompts
from fairgate.workers.engines.vllm.settings import VllmSettings


def test_builds_the_same_files_every_time(tmp_path):
    a = ensure_model("tiny", tmp_path / "a")
    b = ensure_model("tiny", tmp_path / "b")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    config = json.loads((a / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == VOCAB_SIZE
    assert config["num_hidden_layers"] == 2 and config["head_dim"] >= 32
    assert ensure_model("tiny", tmp_path / "a") == a  # already there: reused


def test_tokenizer_round_trips_and_applies_the_chat_template(tmp_path):
    prompts = HuggingFacePrompts(str(ensure_model("tiny", tmp_path / "m")))
    text = prompts.chat_prompt([{"role": "user", "content": "héllo, wörld 42!"}])
    assert text == "<|bos|><|user|>héllo, wörld 42!\n<|assistant|>"
    assert prompts.count(text, templated=True) >= 4
    assert prompts.count("", templated=False) == 0


def test_every_shape_has_a_context_limit_and_unknown_ones_are_refused(tmp_path):
    for shape in SHAPES:
        assert VllmSettings(model=shape).context_limit() == SHAPES[shape]["max_position_embeddings"]
    assert VllmSettings(model="tiny", kv_tokens=1024).context_limit() == 1024
    assert VllmSettings(model="some/hf-model").context_limit() is None
    with pytest.raises(ValueError, match="unknown model shape"):
        ensure_model("huge", tmp_path / "x")
    with pytest.raises(ValueError, match=r"workers\.vllm takes .*; unknown: tensor_parallel"):
        VllmSettings.from_dict({"model": "tiny", "tensor_parallel": 2})


def test_config_takes_a_vllm_section_and_names_bad_fields():
    from fairgate.common.sections import ConfigError
    from fairgate.gateway.config import parse_config
    from fairgate.ingress.prompting import context_limit

    raw = {
        "model": "tiny",
        "workers": {"engine": "vllm", "vllm": {"model": "tiny", "kv_tokens": 2048}, "num_gpus": 1},
        "tenants": [{"name": "a"}],
    }
    config, _ = parse_config(raw)
    assert config.workers.engine == "vllm" and config.workers.settings["vllm"]["kv_tokens"] == 2048
    assert config.workers.num_gpus == 1.0
    assert context_limit(config.ingress, config.workers) == 2048  # the engine's context is below the ingress limit
    for workers, needle in (
        ({"engine": "tgi"}, "workers.engine"),
        ({"engine": "vllm", "vllm": {"modle": "tiny"}}, "unknown: modle"),
        ({"num_gpus": -1}, "workers.num_gpus"),
    ):
        with pytest.raises(ConfigError, match=needle):
            parse_config({**raw, "workers": workers})


def test_serve_flags_switch_the_default_pool_to_a_vllm_model():
    """``fairgate serve --engine vllm --model tiny --kv-tokens 2048 --workers 1``: the embedded default's
    simulated pool becomes one vLLM worker serving the model under its own name (the gateway starting on
    a vLLM pool is test_vllm's; the command starting and stopping, test_serve_cli's)."""
    from fairgate.cli.serve import ServeOverrides, _override
    from fairgate.gateway.config import load_config

    default, _ = load_config(None)
    flags = ServeOverrides(workers=1, policy="vtc", engine="vllm", model="tiny", kv_tokens=2048)
    config = _override(default, flags)
    assert config.workers.engine == "vllm" and config.workers.count == 1
    vllm = VllmSettings.from_dict(config.workers.settings["vllm"])
    assert (vllm.model, vllm.kv_tokens) == ("tiny", 2048)
    assert config.model == "tiny" and [m.name for m in config.models] == ["tiny"]
    assert config.scheduler.policy == "vtc"
    assert _override(default, ServeOverrides(model="tiny")).workers.engine == "vllm"  # a model asks for vLLM
