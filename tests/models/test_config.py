"""ModelConfig against the config.json files transformers writes, in both of its forms."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polymorph.errors import UserError
from polymorph.models.config import ModelConfig, RopeConfig, load_config

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
TINY = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def _to_v4(d: dict[str, Any]) -> dict[str, Any]:
    """The transformers-4 form (`rope_theta` + `rope_scaling`, `torch_dtype`) of a config dict."""
    d = dict(d)
    params = d.pop("rope_parameters", None)
    if params is not None:
        params = dict(params)
        d["rope_theta"] = params.pop("rope_theta")
        d["rope_scaling"] = None if params.get("rope_type") == "default" else params
    if "dtype" in d:
        d["torch_dtype"] = d.pop("dtype")
    return d


def _to_v5(d: dict[str, Any]) -> dict[str, Any]:
    """The transformers-5 form (`rope_parameters`, `dtype`) of a config dict."""
    d = dict(d)
    if "rope_parameters" not in d:
        scaling = d.pop("rope_scaling", None) or {"rope_type": "default"}
        scaling = {("rope_type" if k == "type" else k): v for k, v in scaling.items()}
        d["rope_parameters"] = {"rope_theta": d.pop("rope_theta"), **scaling}
    if "torch_dtype" in d:
        d["dtype"] = d.pop("torch_dtype")
    return d


def _save(tmp_path: Path, hf_config: Any) -> tuple[Path, dict[str, Any]]:
    hf_config.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    return path, json.loads(path.read_text())


def _params(transformers: Any, hf_config: Any) -> int:
    import torch

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


def _write(tmp_path: Path, d: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return path


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_llama3_from_transformers(tmp_path: Path, tied: bool) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaConfig(
        **TINY,
        rope_theta=500000.0,
        rope_scaling=dict(LLAMA3_SCALING),
        max_position_embeddings=256,
        tie_word_embeddings=tied,
        rms_norm_eps=1e-5,
        dtype="bfloat16",
    )
    path, written = _save(tmp_path, hf)
    cfg = load_config(tmp_path)
    assert cfg == load_config(path)
    assert cfg.model_type == "llama" and not cfg.is_moe and not cfg.qk_norm
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size) == (128, 32, 64)
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (
        2,
        4,
        2,
        8,
    )
    assert cfg.rms_norm_eps == 1e-5 and cfg.max_position_embeddings == 256
    assert cfg.tie_word_embeddings is tied and cfg.attention_bias is False and cfg.mlp_bias is False
    assert cfg.dtype == "bfloat16"
    assert cfg.rope == RopeConfig(500000.0, "llama3", 32.0, 1.0, 4.0, 64)
    assert cfg.num_experts is None and cfg.router is None
    # whichever form this transformers writes, the other form parses to the same config
    assert ModelConfig.from_hf(_to_v4(written), "v4") == cfg
    assert ModelConfig.from_hf(_to_v5(written), "v5") == cfg
    assert cfg.param_count() == _params(transformers, hf)
    assert cfg.weight_bytes(2) == 2 * cfg.param_count()


def test_llama2_biases_default_rope(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaConfig(**{**TINY, "num_key_value_heads": 4}, attention_bias=True, mlp_bias=True)
    _, written = _save(tmp_path, hf)
    cfg = load_config(tmp_path)
    assert cfg.rope == RopeConfig(theta=10000.0)
    assert cfg.num_key_value_heads == 4 and cfg.attention_bias and cfg.mlp_bias
    assert cfg.tie_word_embeddings is False
    assert ModelConfig.from_hf(_to_v4(written), "v4") == ModelConfig.from_hf(_to_v5(written), "v5") == cfg
    assert cfg.param_count() == _params(transformers, hf)


def test_mixtral_from_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2, rope_theta=1e6)
    _, written = _save(tmp_path, hf)
    cfg = load_config(tmp_path)
    assert cfg.model_type == "mixtral" and cfg.is_moe and not cfg.qk_norm
    assert (cfg.num_experts, cfg.num_experts_per_tok) == (4, 2)
    assert cfg.expert_intermediate_size == 64 and cfg.moe_intermediate_size is None
    assert cfg.router == "topk_softmax" and cfg.head_dim == 8
    assert cfg.rope == RopeConfig(theta=1e6) and cfg.rms_norm_eps == 1e-5
    assert ModelConfig.from_hf(_to_v4(written), "v4") == ModelConfig.from_hf(_to_v5(written), "v5") == cfg
    assert cfg.param_count() == _params(transformers, hf)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_qwen3_moe_from_transformers(tmp_path: Path, norm_topk_prob: bool) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3MoeConfig(
        **TINY,
        head_dim=16,  # explicit and != hidden / heads, as in the real Qwen3 models
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        norm_topk_prob=norm_topk_prob,
        tie_word_embeddings=True,
    )
    _, written = _save(tmp_path, hf)
    cfg = load_config(tmp_path)
    assert cfg.model_type == "qwen3_moe" and cfg.is_moe and cfg.qk_norm
    assert cfg.head_dim == 16 and cfg.hidden_size == 32
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (4, 2, 16)
    assert cfg.expert_intermediate_size == 16
    assert cfg.norm_topk_prob is norm_topk_prob and cfg.router == "softmax_topk"
    assert cfg.tie_word_embeddings is True
    assert ModelConfig.from_hf(_to_v4(written), "v4") == ModelConfig.from_hf(_to_v5(written), "v5") == cfg
    # transformers 5 writes num_local_experts, transformers 4 num_experts: both are read
    both = {k: v for k, v in written.items() if k not in ("num_experts", "num_local_experts")}
    assert ModelConfig.from_hf({**both, "num_experts": 4}, "a") == ModelConfig.from_hf(
        {**both, "num_local_experts": 4}, "b"
    )
    assert cfg.param_count() == _params(transformers, hf)


@pytest.mark.parametrize("family", ["llama", "mixtral", "qwen3_moe"])
def test_to_hf_round_trips_through_transformers(tmp_path: Path, family: str) -> None:
    transformers = pytest.importorskip("transformers")
    d: dict[str, Any] = {"model_type": family, **TINY, "torch_dtype": "float32"}
    if family == "llama":
        d.update(rope_theta=500000.0, rope_scaling=dict(LLAMA3_SCALING), tie_word_embeddings=True)
    elif family == "mixtral":
        d.update(num_local_experts=4, num_experts_per_tok=2)
    else:
        d.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=16)
    cfg = ModelConfig.from_hf(d, "hand")
    out = cfg.to_hf()
    assert ModelConfig.from_hf(out, "to_hf") == cfg
    assert ModelConfig.from_hf(json.loads(json.dumps(out)), "json") == cfg
    # transformers reads what to_hf writes and writes back an equal config
    _write(tmp_path, out)
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    resaved = tmp_path / "resaved"
    hf.save_pretrained(resaved)
    assert load_config(resaved) == cfg


def test_rope_forms_parse_equal() -> None:
    theta = 500000.0
    v4_rope_type = {"rope_theta": theta, "rope_scaling": dict(LLAMA3_SCALING)}
    v4_type = {
        "rope_theta": theta,
        "rope_scaling": {("type" if k == "rope_type" else k): v for k, v in LLAMA3_SCALING.items()},
    }
    v5 = {"rope_parameters": {"rope_theta": theta, **LLAMA3_SCALING}}
    base = {"model_type": "llama", **TINY}
    parsed = [ModelConfig.from_hf({**base, **form}, "x").rope for form in (v4_rope_type, v4_type, v5)]
    assert parsed[0] == parsed[1] == parsed[2] == RopeConfig(theta, "llama3", 32.0, 1.0, 4.0, 64)

    plain = [
        {"rope_theta": 1e4},
        {"rope_theta": 1e4, "rope_scaling": None},
        {"rope_theta": 1e4, "rope_scaling": {"type": "default"}},
        {"rope_parameters": {"rope_theta": 1e4, "rope_type": "default"}},
        {},  # the family's default theta
    ]
    for form in plain:
        assert ModelConfig.from_hf({**base, **form}, "x").rope == RopeConfig(theta=1e4)


def test_rope_inv_freq_matches_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = transformers.LlamaConfig(
        **{**TINY, "hidden_size": 256, "num_attention_heads": 2}, rope_theta=500000.0,
        rope_scaling=dict(LLAMA3_SCALING), max_position_embeddings=256,
    )  # fmt: skip
    cfg = ModelConfig.from_hf(hf.to_dict(), "hf")
    assert cfg.head_dim == 128
    expected, scale = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    assert scale == 1.0
    np.testing.assert_allclose(cfg.rope.inv_freq(cfg.head_dim), expected.double().numpy(), rtol=1e-6)
    # all three regimes (kept, divided by factor, smoothed) occur at this head_dim and context
    plain = RopeConfig(theta=500000.0).inv_freq(128)
    ratio = plain / cfg.rope.inv_freq(128)
    assert np.isclose(ratio, 1).any() and np.isclose(ratio, 32).any()
    assert ((ratio > 1.01) & (ratio < 31.9)).any()


def _error(tmp_path: Path, d: dict[str, Any] | str) -> str:
    path = tmp_path / "config.json"
    path.write_text(d if isinstance(d, str) else json.dumps(d))
    with pytest.raises(UserError) as e:
        load_config(path)
    message = str(e.value)
    assert str(path) in message and "\n" not in message
    return message


def test_errors_name_the_file_and_the_fault(tmp_path: Path) -> None:
    base = {"model_type": "llama", **TINY}
    assert "not valid JSON" in _error(tmp_path, '{"model_type": "llama",')
    msg = _error(tmp_path, {**base, "model_type": "gpt2"})
    assert "'gpt2'" in msg and "llama, mixtral, qwen3_moe" in msg
    no_model_type = {k: v for k, v in base.items() if k != "model_type"}
    assert "`model_type` is missing" in _error(tmp_path, no_model_type)
    no_hidden = {k: v for k, v in base.items() if k != "hidden_size"}
    assert "`hidden_size` is missing" in _error(tmp_path, no_hidden)
    assert "`hidden_size` must be a positive integer" in _error(tmp_path, {**base, "hidden_size": "32"})
    assert "`num_hidden_layers` must be a positive integer" in _error(
        tmp_path, {**base, "num_hidden_layers": 2.5}
    )
    assert "`tie_word_embeddings` must be true or false" in _error(
        tmp_path, {**base, "tie_word_embeddings": 1}
    )
    assert "`rms_norm_eps` must be a number" in _error(tmp_path, {**base, "rms_norm_eps": "1e-5"})
    assert "a JSON object" in _error(tmp_path, "[1, 2]")
    assert "multiple of num_key_value_heads" in _error(tmp_path, {**base, "num_key_value_heads": 3})
    assert "add `head_dim`" in _error(tmp_path, {**base, "num_attention_heads": 5, "num_key_value_heads": 5})
    assert "hidden_act 'gelu'" in _error(tmp_path, {**base, "hidden_act": "gelu"})

    for rope in (
        {"rope_scaling": {"type": "yarn", "factor": 4.0}},
        {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
        {"rope_parameters": {"rope_theta": 1e4, "rope_type": "linear", "factor": 2.0}},
    ):
        assert "supported: default, llama3" in _error(tmp_path, {**base, **rope})
    partial = {k: v for k, v in LLAMA3_SCALING.items() if k != "low_freq_factor"}
    assert "needs `low_freq_factor`" in _error(tmp_path, {**base, "rope_scaling": partial})
    assert "rope_theta must be a positive number" in _error(tmp_path, {**base, "rope_theta": "big"})

    mixtral = {**base, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
    assert "sliding_window=4096" in _error(tmp_path, {**mixtral, "sliding_window": 4096})
    assert "exceeds the 4 experts" in _error(tmp_path, {**mixtral, "num_experts_per_tok": 5})
    no_experts = {k: v for k, v in mixtral.items() if k != "num_local_experts"}
    assert "`num_local_experts` is missing" in _error(tmp_path, no_experts)
    qwen = {
        **base,
        "model_type": "qwen3_moe",
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
    }
    assert "all-MoE" in _error(tmp_path, {**qwen, "decoder_sparse_step": 2})
    assert "all-MoE" in _error(tmp_path, {**qwen, "mlp_only_layers": [0]})
    assert "disagree" in _error(tmp_path, {**qwen, "num_local_experts": 8})
    assert "use_sliding_window" in _error(tmp_path, {**qwen, "use_sliding_window": True})


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"config\.json: no such file"):
        load_config(tmp_path)


def test_param_count_by_hand() -> None:
    # Llama-3.2-1B: 1,235,814,400 parameters (tied embeddings)
    llama_1b = {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "rope_theta": 500000.0,
        "rope_scaling": dict(LLAMA3_SCALING, original_max_position_embeddings=8192),
        "torch_dtype": "bfloat16",
    }
    cfg = ModelConfig.from_hf(llama_1b, "llama-3.2-1b")
    assert cfg.param_count() == 1_235_814_400
    assert cfg.weight_bytes(2) == 2_471_628_800
    untied = ModelConfig.from_hf({**llama_1b, "tie_word_embeddings": False}, "untied")
    assert untied.param_count() == cfg.param_count() + 128256 * 2048
