"""The issue-15 families' configs and weights against transformers: parameter counts, rope
frequencies of every rope type, both config.json forms of Gemma 3, Phi-3's fused weights split at load
and Gemma's (1 + w) norms folded at load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from polymorph.errors import UserError
from polymorph.ir.dtypes import DType
from polymorph.models import load_model
from polymorph.models.config import ModelConfig, load_config
from polymorph.models.decoder import build_decoder
from polymorph.models.weights import checkpoint_weights

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip

PHI3_IDS = dict(
    pad_token_id=0, bos_token_id=1, eos_token_id=2
)  # the defaults lie outside the tiny vocabulary
CONFIGS: dict[str, Any] = {
    "gemma2": lambda: transformers.Gemma2Config(**TINY, head_dim=16, sliding_window=8),
    "gemma3_text": lambda: transformers.Gemma3TextConfig(**TINY, head_dim=16, sliding_window=8),
    "phi3": lambda: transformers.Phi3Config(**TINY, **PHI3_IDS, partial_rotary_factor=0.5),
    "granite": lambda: transformers.GraniteConfig(
        **TINY,
        embedding_multiplier=12.0,
        attention_multiplier=0.1,
        residual_multiplier=0.3,
        logits_scaling=4.0,
    ),
}


@pytest.mark.parametrize("family", list(CONFIGS))
def test_param_count_and_fields_match_transformers(family: str) -> None:
    hf = CONFIGS[family]()
    cfg = ModelConfig.from_hf(hf.to_dict(), "hf")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf)
    assert cfg.param_count() == sum(p.numel() for p in model.parameters())
    graph = build_decoder(cfg, name=family)
    hf_names = set(model.state_dict())
    if cfg.tie_word_embeddings:
        hf_names.discard("lm_head.weight")
    if family == "phi3":  # the graph reads the fused projections as the separate ones
        hf_names = {n.replace("qkv_proj", "q_proj") for n in hf_names} | {
            n.replace("qkv_proj", p) for n in hf_names if "qkv_proj" in n for p in ("k_proj", "v_proj")
        }
        hf_names = {n.replace("gate_up_proj", "gate_proj") for n in hf_names} | {
            n.replace("gate_up_proj", "up_proj") for n in hf_names if "gate_up_proj" in n
        }
    assert set(graph.params) == hf_names
    if family == "granite":
        assert (cfg.scale, cfg.embedding_multiplier, cfg.residual_multiplier, cfg.logits_scaling) == (
            0.1, 12.0, 0.3, 4.0)  # fmt: skip
    if family in ("gemma2", "gemma3_text"):
        assert cfg.scale == hf.query_pre_attn_scalar**-0.5 and cfg.hidden_act == "gelu_tanh"
    if family == "phi3":
        assert cfg.rope.rotary_dim == 4  # head_dim 8 * 0.5


ROPES: list[dict[str, Any]] = [
    {"rope_type": "linear", "factor": 3.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16, "beta_fast": 16, "beta_slow": 2,
     "mscale": 0.7, "mscale_all_dim": 0.5},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "attention_factor": 1.3,
     "truncate": False},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16},
]  # fmt: skip


@pytest.mark.parametrize("rope", ROPES, ids=lambda r: "-".join(str(v) for v in r.values()))
@pytest.mark.parametrize("seq_len", [None, 40, 200])
def test_rope_frequencies_match_transformers(rope: dict[str, Any], seq_len: int | None) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = transformers.LlamaConfig(**{**TINY, "hidden_size": 128, "num_attention_heads": 2,
                                     "max_position_embeddings": 64}, rope_parameters={"rope_theta": 5e5, **rope})  # fmt: skip
    cfg = ModelConfig.from_hf(hf.to_dict(), "hf")
    want, factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu", seq_len=seq_len)
    np.testing.assert_allclose(cfg.rope.inv_freq(cfg.head_dim, seq_len), want.double().numpy(), rtol=2e-6)
    assert cfg.rope.attention_factor == pytest.approx(factor, rel=1e-9)


@pytest.mark.parametrize("seq_len", [None, 8, 9, 100])
def test_longrope_partial_rotary_matches_transformers(seq_len: int | None) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rng = np.random.default_rng(0)
    rope = {"rope_type": "longrope", "short_factor": (1 + rng.random(2)).tolist(),
            "long_factor": (1 + 9 * rng.random(2)).tolist()}  # fmt: skip
    hf = transformers.Phi3Config(**TINY, **PHI3_IDS, partial_rotary_factor=0.5, original_max_position_embeddings=8,
                                 rope_parameters={"rope_theta": 1e4, **rope})  # fmt: skip
    cfg = ModelConfig.from_hf(hf.to_dict(), "hf")
    want, factor = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu", seq_len=seq_len)
    np.testing.assert_allclose(cfg.rope.inv_freq(cfg.head_dim, seq_len), want.double().numpy(), rtol=2e-6)
    assert cfg.rope.attention_factor == pytest.approx(factor, rel=1e-9) and factor > 1  # 64 / 8 = 8


def test_gemma3_both_config_forms_parse_equal(tmp_path: Path) -> None:
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
    hf = transformers.Gemma3TextConfig(**{**TINY, "num_hidden_layers": 7}, head_dim=16, sliding_window=8,
                                       rope_parameters=rope)  # fmt: skip
    hf.save_pretrained(tmp_path)
    v5 = load_config(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    assert "layer_types" in d and "full_attention" in d["rope_parameters"]
    v4 = {k: v for k, v in d.items() if k not in ("layer_types", "rope_parameters")}
    v4.update(rope_theta=1e6, rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_local_base_freq=1e4,
              sliding_window_pattern=6)  # fmt: skip
    assert ModelConfig.from_hf(v4, "v4") == v5
    assert [v5.layer_window(i) for i in range(7)] == [8] * 5 + [0, 8]
    assert (v5.layer_rope(5).rope_type, v5.layer_rope(5).factor, v5.layer_rope(0).theta) == (
        "linear",
        8.0,
        1e4,
    )
    # and transformers reads the transformers-4 form the same way
    (tmp_path / "config.json").write_text(json.dumps(v4))
    again = transformers.AutoConfig.from_pretrained(tmp_path)
    assert again.layer_types == list(v5.layer_types)
    assert again.rope_parameters["full_attention"]["factor"] == 8.0


def _phi3_checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**TINY, **PHI3_IDS)).eval()
    model.save_pretrained(tmp_path)
    return tmp_path


def test_phi3_fused_weights_are_split_by_rows(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    path = _phi3_checkpoint(tmp_path)
    stored = load_file(path / "model.safetensors")
    w = load_model(path).weights()
    qkv = stored["model.layers.1.self_attn.qkv_proj.weight"]  # q rows (4 * 8), k and v rows (2 * 8 each)
    np.testing.assert_array_equal(w["model.layers.1.self_attn.q_proj.weight"], qkv[:32])
    np.testing.assert_array_equal(w["model.layers.1.self_attn.k_proj.weight"], qkv[32:48])
    np.testing.assert_array_equal(w["model.layers.1.self_attn.v_proj.weight"], qkv[48:])
    gate_up = stored["model.layers.2.mlp.gate_up_proj.weight"]
    np.testing.assert_array_equal(w["model.layers.2.mlp.gate_proj.weight"], gate_up[:48])
    np.testing.assert_array_equal(w["model.layers.2.mlp.up_proj.weight"], gate_up[48:])


def test_phi3_fused_weight_of_the_wrong_shape_is_refused_by_name(tmp_path: Path) -> None:
    model = load_model(_phi3_checkpoint(tmp_path))
    from safetensors.numpy import load_file

    tensors = dict(load_file(tmp_path / "model.safetensors"))
    name = "model.layers.0.self_attn.qkv_proj.weight"
    tensors[name] = tensors[name][:-8]
    with pytest.raises(
        UserError, match=r"`model\.layers\.0\.self_attn\.qkv_proj\.weight` has shape \[56, 32\].*64 rows"
    ):
        checkpoint_weights(model.graph, tensors, "ckpt")
    del tensors[name]
    with pytest.raises(
        UserError, match=r"no tensor `model\.layers\.0\.self_attn\.q_proj\.weight` \(nor the fused"
    ):
        checkpoint_weights(model.graph, tensors, "ckpt")


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16])
def test_gemma_norms_are_folded_to_one_plus_w_in_f32(dtype: DType) -> None:
    hf = CONFIGS["gemma3_text"]()
    cfg = ModelConfig.from_hf(hf.to_dict(), "hf")
    graph = build_decoder(cfg, name="g", dtype=dtype)
    rng = np.random.default_rng()
    tensors = {n: (0.3 * rng.standard_normal([int(s) for s in t.shape])).astype(np.float32)
               for n, t in graph.params.items()}  # fmt: skip
    if dtype == DType.BF16:
        tensors = {n: a.astype(ml_dtypes.bfloat16) for n, a in tensors.items()}
    got = checkpoint_weights(graph, tensors, "ckpt")
    norms = [n for n in graph.params if n.endswith("norm.weight")]
    assert len(norms) == 3 * 6 + 1  # four per layer, q and k norms, the final one
    for n in norms:
        want = (tensors[n].astype(np.float32) + np.float32(1)).astype(dtype.numpy)
        np.testing.assert_array_equal(got[n], want)
    other = "model.layers.0.self_attn.q_proj.weight"
    np.testing.assert_array_equal(got[other], tensors[other])


ROUND_TRIP: dict[str, dict[str, Any]] = {
    "gemma2": {"model_type": "gemma2", "head_dim": 16, "sliding_window": 8},
    "gemma3": {"model_type": "gemma3_text", "head_dim": 16, "sliding_window": 8, "sliding_window_pattern": 3,
               "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    "phi3": {"model_type": "phi3", **PHI3_IDS, "partial_rotary_factor": 0.5, "original_max_position_embeddings": 16,
             "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.1], "long_factor": [2.0, 3.0]},
             "sliding_window": 9},
    "granite": {"model_type": "granite", "embedding_multiplier": 12.0, "attention_multiplier": 0.1,
                "residual_multiplier": 0.3, "logits_scaling": 4.0},
    "yarn": {"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                                                     "original_max_position_embeddings": 32}},
    "dynamic": {"model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}},
}  # fmt: skip


@pytest.mark.parametrize("name", [*ROUND_TRIP, "phi-4-mini", "gemma-3-12b", "granite-3.3-8b"])
def test_to_hf_round_trips_through_transformers(tmp_path: Path, name: str) -> None:
    from polymorph.models.zoo import zoo_config

    cfg = (
        zoo_config(name)
        if name not in ROUND_TRIP
        else ModelConfig.from_hf({**TINY, **ROUND_TRIP[name]}, name)
    )
    out = cfg.to_hf()
    assert ModelConfig.from_hf(json.loads(json.dumps(out)), "to_hf") == cfg
    (tmp_path / "config.json").write_text(json.dumps(out))
    transformers.AutoConfig.from_pretrained(tmp_path).save_pretrained(tmp_path / "resaved")
    assert load_config(tmp_path / "resaved") == cfg
