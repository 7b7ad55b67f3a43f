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


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe"])
def test_to_hf_round_trips_through_transformers(tmp_path: Path, family: str) -> None:
    transformers = pytest.importorskip("transformers")
    d: dict[str, Any] = {"model_type": family, **TINY, "torch_dtype": "float32"}
    if family == "llama":
        d.update(rope_theta=500000.0, rope_scaling=dict(LLAMA3_SCALING), tie_word_embeddings=True)
    elif family == "mixtral":
        d.update(num_local_experts=4, num_experts_per_tok=2)
    elif family == "qwen3_moe":
        d.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=16)
    elif family == "qwen3":
        d.update(head_dim=16, attention_bias=True)
    elif family == "mistral":
        d.update(sliding_window=None)
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
    assert "'gpt2'" in msg and "llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3, granite" in msg
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
    assert "hidden_act 'relu'" in _error(tmp_path, {**base, "hidden_act": "relu"})
    assert "`hidden_activation`='gelu' disagrees" in _error(tmp_path, {**base, "hidden_activation": "gelu"})
    assert "rope type 'su'" in _error(tmp_path, {**base, "rope_scaling": {"type": "su", "factor": 4.0}})
    assert "needs `factor`" in _error(tmp_path, {**base, "rope_scaling": {"rope_type": "linear"}})
    assert "longrope needs `short_factor`" in _error(
        tmp_path, {**base, "rope_scaling": {"rope_type": "longrope", "long_factor": [1.0] * 4}}
    )
    partial = {k: v for k, v in LLAMA3_SCALING.items() if k != "low_freq_factor"}
    assert "needs `low_freq_factor`" in _error(tmp_path, {**base, "rope_scaling": partial})
    assert "`rope_theta` must be a positive number" in _error(tmp_path, {**base, "rope_theta": "big"})

    mixtral = {**base, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
    assert "`sliding_window` must be a positive integer" in _error(tmp_path, {**mixtral, "sliding_window": 0})
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
    # dense layers are read as Qwen3MoeDecoderLayer places them, not refused
    assert ModelConfig.from_hf({**qwen, "decoder_sparse_step": 2}, "q").dense_layers == (0,)
    assert ModelConfig.from_hf({**qwen, "mlp_only_layers": [1]}, "q").dense_layers == (1,)
    assert "`mlp_only_layers` must be a list of layer indices" in _error(
        tmp_path, {**qwen, "mlp_only_layers": "0"}
    )
    assert "disagree" in _error(tmp_path, {**qwen, "num_local_experts": 8})
    assert "layer_types has 1 entries for 2 layers" in _error(
        tmp_path, {**qwen, "layer_types": ["full_attention"]}
    )


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


def _dense(transformers: Any, family: str, **kw: Any) -> Any:
    cls = {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "mistral": "MistralConfig"}[family]
    return getattr(transformers, cls)(**TINY, **kw)


@pytest.mark.parametrize(
    ("family", "kw"),
    [
        ("qwen2", {}),
        (
            "qwen2",
            {"tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
        ),
        ("qwen3", {"head_dim": 16}),
        ("qwen3", {"head_dim": 16, "attention_bias": True, "tie_word_embeddings": True}),
        ("mistral", {"sliding_window": None}),
        (
            "mistral",
            {"sliding_window": None, "head_dim": 16, "rope_parameters": LLAMA3_SCALING | {"rope_theta": 5e5}},
        ),
    ],
    ids=["qwen2", "qwen2-tied", "qwen3", "qwen3-bias-tied", "mistral", "mistral-head_dim-llama3"],
)
def test_dense_families_from_transformers(tmp_path: Path, family: str, kw: dict[str, Any]) -> None:
    transformers = pytest.importorskip("transformers")
    hf = _dense(transformers, family, **kw)
    _, written = _save(tmp_path, hf)
    cfg = load_config(tmp_path)
    assert cfg.model_type == family and not cfg.is_moe and cfg.num_experts is None
    assert cfg.qk_norm is (family == "qwen3")
    assert cfg.qkv_bias is (family == "qwen2" or bool(kw.get("attention_bias")))
    assert cfg.o_bias is bool(kw.get("attention_bias"))
    assert cfg.head_dim == (getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    assert cfg.tie_word_embeddings is bool(kw.get("tie_word_embeddings"))
    assert cfg.rms_norm_eps == hf.rms_norm_eps and cfg.max_position_embeddings == hf.max_position_embeddings
    want = hf.rope_parameters
    assert (cfg.rope.theta, cfg.rope.rope_type) == (want["rope_theta"], want["rope_type"])
    assert ModelConfig.from_hf(_to_v4(written), "v4") == ModelConfig.from_hf(_to_v5(written), "v5") == cfg
    assert cfg.param_count() == _params(transformers, hf)


def test_qwen3_head_dim_defaults_to_128_as_in_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    d = {"model_type": "qwen3", **TINY}
    assert ModelConfig.from_hf(d, "x").head_dim == transformers.Qwen3Config(**TINY).head_dim == 128
    assert ModelConfig.from_hf({**d, "model_type": "qwen2"}, "x").head_dim == 8


@pytest.mark.parametrize(
    "rope",
    [
        # the silent case of issue 15: transformers 5 applies the rope_scaling next to rope_parameters
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "rope_scaling": LLAMA3_SCALING},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "rope_scaling": LLAMA3_SCALING | {"rope_theta": 5e5}},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}, "rope_scaling": LLAMA3_SCALING},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}, "rope_scaling": LLAMA3_SCALING, "rope_theta": 2.5e5},
        {"rope_parameters": LLAMA3_SCALING | {"rope_theta": 1e4}, "rope_scaling": None},
        {"rope_parameters": LLAMA3_SCALING | {"rope_theta": 1e4}, "rope_scaling": {"rope_type": "default"}},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}, "rope_scaling": {}},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "rope_theta": 5e5},
        {"rope_parameters": {"rope_type": "default"}, "rope_theta": 2.5e5},
        {"rope_parameters": {k: v for k, v in LLAMA3_SCALING.items() if k != "original_max_position_embeddings"}},
        {"rope_scaling": {"type": "llama3", **{k: v for k, v in LLAMA3_SCALING.items() if k != "rope_type"}}, "rope_theta": 5e5},
    ],
    ids=["both-forms", "scaling-theta", "params-theta-lost", "top-theta", "params-llama3", "scaling-default",
         "scaling-empty", "params-theta-wins", "top-theta-fills", "no-original-max", "v4-type"],
)  # fmt: skip
def test_rope_precedence_matches_transformers(tmp_path: Path, rope: dict[str, Any]) -> None:
    """Whatever mix of the two rope forms a config.json holds, the rope is the one transformers 5 uses."""
    transformers = pytest.importorskip("transformers")
    d = {"model_type": "llama", **TINY, "max_position_embeddings": 256, **rope}
    path = _write(tmp_path, d)
    hf = transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters
    got = load_config(path).rope
    assert (got.rope_type, got.theta) == (hf["rope_type"], hf["rope_theta"])
    if got.rope_type == "llama3":
        fields = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        assert tuple(getattr(got, f) for f in fields) == tuple(hf[f] for f in fields)


# (key, a value polymorph does not implement, a neutral value it accepts)
UNIMPLEMENTED = [
    ("attn_logit_softcapping", 50.0, None),
    ("final_logit_softcapping", 30.0, None),
    ("query_pre_attn_scalar", 256, 8),  # neutral: equal to head_dim
    ("attention_multiplier", 0.015625, 8**-0.5),
    ("partial_rotary_factor", 0.5, 1.0),
    ("embedding_multiplier", 12.0, 1.0),
    ("residual_multiplier", 0.22, 1.0),
    ("logits_scaling", 16.0, 1.0),
    ("logit_scale", 0.0625, None),
    ("clip_qkv", 8.0, None),
    ("attention_chunk_size", 8192, None),
    ("use_qk_norm", True, False),
    ("use_bidirectional_attention", True, False),
    ("rope_local_base_freq", 10000.0, None),
]


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize(("key", "bad", "neutral"), UNIMPLEMENTED, ids=[u[0] for u in UNIMPLEMENTED])
def test_unimplemented_fields_are_refused_by_name(
    tmp_path: Path, family: str, key: str, bad: Any, neutral: Any
) -> None:
    base = {"model_type": family, **TINY, "sliding_window": None}
    msg = _error(tmp_path, {**base, key: bad})
    assert f"`{key}`={bad!r}" in msg and "not implemented" in msg
    assert ModelConfig.from_hf({**base, key: neutral}, "x") == ModelConfig.from_hf(base, "x")


def test_partial_rotary_inside_rope_parameters_and_per_layer_rope_are_refused(tmp_path: Path) -> None:
    base = {"model_type": "llama", **TINY}
    rope = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}
    assert "partial_rotary_factor=0.25" in _error(tmp_path, {**base, "rope_parameters": rope})
    assert "only phi3, glm4_moe, minimax_m2 rotate part of the head" in _error(
        tmp_path, {**base, "rope_parameters": rope}
    )
    nested = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
    assert "rope per layer type (full_attention, sliding_attention)" in _error(
        tmp_path, {**base, "rope_parameters": nested}
    )


@pytest.mark.parametrize(
    "quant",
    [
        {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
        {"quant_method": "mxfp4"},
        {"quant_method": "awq", "bits": 4, "group_size": 128},
        {"quant_method": "gptq", "bits": 4},
    ],
    ids=lambda q: q["quant_method"],
)
def test_quantized_checkpoints_are_refused_by_name(tmp_path: Path, quant: dict[str, Any]) -> None:
    msg = _error(tmp_path, {"model_type": "qwen3", **TINY, "quantization_config": quant})
    assert f"`quantization_config` (quant_method {quant['quant_method']!r})" in msg and "unquantized" in msg


def test_sliding_windows_per_layer(tmp_path: Path) -> None:
    """Which layers attend through a window, as each family's transformers classes decide it."""
    mistral = {"model_type": "mistral", **TINY}
    assert [ModelConfig.from_hf(mistral, "x").layer_window(i) for i in range(2)] == [4096, 4096]  # default
    assert ModelConfig.from_hf({**mistral, "sliding_window": 7}, "x").layer_window(1) == 7
    assert ModelConfig.from_hf({**mistral, "sliding_window": None}, "x").layer_window(0) == 0
    assert "sliding_window=4096" in _error(
        tmp_path, {**mistral, "model_type": "llama", "sliding_window": 4096}
    )

    qwen2 = {"model_type": "qwen2", **TINY, "sliding_window": 4096}
    assert ModelConfig.from_hf(qwen2, "off").sliding_window is None  # use_sliding_window false (default)
    on = {**qwen2, "use_sliding_window": True}
    assert ModelConfig.from_hf({**on, "max_window_layers": 2}, "no layer reaches it").sliding_window is None
    cfg = ModelConfig.from_hf({**on, "max_window_layers": 1}, "x")
    assert (cfg.layer_window(0), cfg.layer_window(1)) == (0, 4096)
    types = ["sliding_attention", "full_attention"]
    cfg = ModelConfig.from_hf({**on, "layer_types": types}, "x")
    assert (cfg.layer_window(0), cfg.layer_window(1)) == (4096, 0)
    moe = {**on, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 16}  # fmt: skip
    assert ModelConfig.from_hf(moe, "x").layer_types == ("sliding_attention",) * 2  # every layer

    gemma = {"model_type": "gemma3_text", **TINY, "num_hidden_layers": 7, "sliding_window": 5}
    assert [ModelConfig.from_hf(gemma, "x").layer_window(i) for i in range(7)] == [5] * 5 + [0, 5]
    pattern = ModelConfig.from_hf({**gemma, "sliding_window_pattern": 3}, "x")
    assert [pattern.layer_window(i) for i in range(7)] == [5, 5, 0, 5, 5, 0, 5]
    gemma2 = ModelConfig.from_hf({**gemma, "model_type": "gemma2"}, "x")
    assert [gemma2.layer_window(i) for i in range(3)] == [5, 0, 5]


@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3"])
@pytest.mark.parametrize("pattern", [0, 1, 2], ids=["sliding-first", "full-first", "none-given"])
def test_layer_windows_match_transformers(family: str, pattern: int) -> None:
    """The window of every layer, against the config object transformers builds (layer_types given
    two ways, or left to the family's default)."""
    transformers = pytest.importorskip("transformers")

    layers = 4
    kinds = ("sliding_attention", "full_attention")
    kw: dict[str, Any] = {**TINY, "num_hidden_layers": layers, "sliding_window": 6}
    if pattern < 2 and family in ("qwen2", "qwen3", "gemma2", "gemma3_text"):
        kw["layer_types"] = [kinds[(i + pattern) % 2] for i in range(layers)]
    if family in ("qwen2", "qwen3"):
        kw.update(use_sliding_window=True, max_window_layers=1)
    hf = transformers.AutoConfig.for_model(family, **kw)
    cfg = ModelConfig.from_hf(hf.to_dict(), "hf")
    for i in range(layers):
        if family in ("mistral", "phi3"):
            want = hf.sliding_window
        else:
            want = hf.sliding_window if hf.layer_types[i] == "sliding_attention" else 0
        assert cfg.layer_window(i) == (want or 0), (family, i)
