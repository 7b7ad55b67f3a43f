"""Every rope type of the op table against transformers' own `ROPE_INIT_FUNCTIONS` (inverse frequencies
and the attention factor each returns), called directly on the configuration it documents, and the
whole rope op (partial rotary, attention factor, per-call frequencies) against transformers' rotary
embedding modules and `apply_rotary_pos_emb`.

Each configuration names the public checkpoint whose config.json (rope_parameters / rope_scaling,
rope_theta, head_dim, partial_rotary_factor) it copies; longrope's factor lists are drawn at random
(the real ones are 48 or 64 measured numbers; their values do not change the code path).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from polymorph.ir import reference
from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType
from polymorph.ir.ops import OPS, OpError, normalize_attrs
from polymorph.ir.spec import GraphError

torch = pytest.importorskip("torch")
rope_utils = pytest.importorskip("transformers.modeling_rope_utils")


@dataclass(frozen=True)
class Case:
    """A checkpoint's rope: its HF `rope_parameters`, head_dim, max_position_embeddings, and the rope
    op's attributes the loader maps them to."""

    source: str
    head_dim: int
    max_positions: int
    hf: dict[str, Any]
    attrs: dict[str, Any]


def _factors(seed: int, n: int, hi: float) -> list[float]:
    rng = np.random.default_rng(seed)
    return sorted(float(v) for v in rng.uniform(1.0, hi, n))


_PHI4_SHORT, _PHI4_LONG = _factors(1, 48, 3.0), _factors(2, 48, 60.0)
_PHI3_SHORT, _PHI3_LONG = _factors(3, 48, 2.0), _factors(4, 48, 40.0)

CASES = [
    # Qwen/Qwen3-8B: rope_theta 1e6, head_dim 128, no scaling
    Case("Qwen3-8B", 128, 40960, {"rope_type": "default", "rope_theta": 1e6}, {"theta": 1e6}),
    # lmsys/longchat-7b-16k: Llama-7B heads, rope_scaling {"type": "linear", "factor": 8.0}
    Case("longchat-7b-16k", 128, 16384, {"rope_type": "linear", "rope_theta": 1e4, "factor": 8.0},
         {"theta": 1e4, "rope_type": "linear", "factor": 8.0}),
    # meta-llama/Llama-2-7b-hf heads (4096 positions) with {"type": "dynamic", "factor": 2.0}, the
    # dynamic NTK scaling transformers' Llama docs describe
    Case("Llama-2-7b dynamic", 128, 4096, {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
         {"theta": 1e4, "rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4096}),
    # Qwen/Qwen2.5-7B-Instruct's documented YaRN: {"factor": 4.0, "original_max_position_embeddings":
    # 32768, "type": "yarn"}, rope_theta 1e6, head_dim 128
    Case("Qwen2.5-7B yarn", 128, 131072,
         {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768},
         {"theta": 1e6, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    # deepseek-ai/DeepSeek-V3: yarn factor 40, mscale = mscale_all_dim = 1, beta 32/1, 4096 original
    # positions, rope on qk_rope_head_dim 64
    Case("DeepSeek-V3 yarn", 64, 163840,
         {"rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "original_max_position_embeddings": 4096,
          "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
         {"theta": 1e4, "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
          "beta_fast": 32.0, "beta_slow": 1.0}),
    # openai/gpt-oss-20b: yarn factor 32, beta 32/1, truncate false, rope_theta 150000, head_dim 64
    Case("gpt-oss-20b yarn", 64, 131072,
         {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "original_max_position_embeddings": 4096,
          "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
         {"theta": 150000.0, "rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
          "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}),
    # THUDM/glm-4-9b-style partial rotary (partial_rotary_factor 0.5) under Qwen2.5's YaRN
    Case("partial-rotary yarn", 128, 131072,
         {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 32768,
          "partial_rotary_factor": 0.5},
         {"theta": 1e4, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
          "rotary_dim": 64}),
    # microsoft/Phi-4-mini-instruct: longrope, partial_rotary_factor 0.75 of head_dim 128 (rotary 96,
    # 48 factors), 4096 original of 131072 positions, no `factor` (transformers takes 131072 / 4096)
    Case("Phi-4-mini longrope", 128, 131072,
         {"rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 4096,
          "short_factor": _PHI4_SHORT, "long_factor": _PHI4_LONG, "partial_rotary_factor": 0.75},
         {"theta": 1e4, "rope_type": "longrope", "original_max_position_embeddings": 4096, "factor": 32.0,
          "short_factor": _PHI4_SHORT, "long_factor": _PHI4_LONG, "rotary_dim": 96}),
    # microsoft/Phi-3-mini-128k-instruct: longrope on the whole head_dim 96, 4096 of 131072 positions
    Case("Phi-3-mini-128k longrope", 96, 131072,
         {"rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 4096,
          "short_factor": _PHI3_SHORT, "long_factor": _PHI3_LONG},
         {"theta": 1e4, "rope_type": "longrope", "original_max_position_embeddings": 4096, "factor": 32.0,
          "short_factor": _PHI3_SHORT, "long_factor": _PHI3_LONG}),
    # meta-llama/Llama-3.2-1B: llama3 factor 32, low 1, high 4, 8192 original positions, head_dim 64
    Case("Llama-3.2-1B", 64, 131072,
         {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
         {"theta": 500000.0, "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
]  # fmt: skip
IDS = [c.source for c in CASES]


def hf_config(case: Case) -> Any:
    from transformers import LlamaConfig

    heads = 4
    return LlamaConfig(
        hidden_size=case.head_dim * heads,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=case.head_dim,
        max_position_embeddings=case.max_positions,
        rope_parameters=dict(case.hf),
    )


def hf_init(case: Case, seq_len: int | None) -> tuple[np.ndarray, float]:
    rope_type = case.hf["rope_type"]
    config = hf_config(case)
    if rope_type == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        inv, factor = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        inv, factor = rope_utils.ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)
    return inv.double().numpy(), float(factor)


def attention_factor(case: Case) -> float:
    """`reference.rope_attention_factor` of the case's HF parameters: what the loader puts in the op."""
    hf = case.hf
    return reference.rope_attention_factor(
        hf["rope_type"],
        case.attrs.get("factor", 1.0),
        case.attrs.get("original_max_position_embeddings", 8192),
        hf.get("attention_factor"),
        hf.get("mscale"),
        hf.get("mscale_all_dim"),
    )


def attrs(case: Case) -> dict[str, Any]:
    """The rope op's attributes, as the loader maps the case's config."""
    return normalize_attrs(OPS["rope"], {**case.attrs, "attention_factor": attention_factor(case)})


def seq_lens(case: Case) -> list[int | None]:
    """The lengths at which a type's frequencies differ: none for the static types; below, at and
    past the boundary for dynamic (max_position_embeddings) and longrope (the original length)."""
    kind = case.hf["rope_type"]
    if kind == "dynamic":
        return [None, 17, case.max_positions, case.max_positions + 1, 3 * case.max_positions + 5]
    if kind == "longrope":
        old = case.hf["original_max_position_embeddings"]
        return [None, 17, old, old + 1, 20 * old]
    return [None]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_inv_freq_and_attention_factor_match_transformers(case: Case) -> None:
    a = attrs(case)
    for seq_len in seq_lens(case):
        want_inv, want_factor = hf_init(case, seq_len)
        got = reference.rope_inv_freq(case.head_dim, a, np.float64, seq_len=seq_len)
        assert got.shape == want_inv.shape, f"{case.source} seq_len={seq_len}"
        # transformers computes in float32 (dynamic's grown base too), polymorph in float64
        np.testing.assert_allclose(got, want_inv, rtol=2e-6, err_msg=f"{case.source} seq_len={seq_len}")
        assert math.isclose(a["attention_factor"], want_factor, rel_tol=1e-12), case.source


def test_the_scaled_types_differ_where_they_should() -> None:
    """Guards the test above against configs that happen to equal the default frequencies."""
    by = {c.source: c for c in CASES}
    dyn = attrs(by["Llama-2-7b dynamic"])
    assert np.array_equal(reference.rope_inv_freq(128, dyn, seq_len=4096), reference.rope_inv_freq(128, dyn))
    assert (reference.rope_inv_freq(128, dyn, seq_len=4097)[1:] < reference.rope_inv_freq(128, dyn)[1:]).all()
    phi = attrs(by["Phi-4-mini longrope"])
    short, long = (reference.rope_inv_freq(128, phi, seq_len=n) for n in (4096, 4097))
    assert short.shape == (48,) and not np.allclose(short, long)
    assert phi["attention_factor"] > 1.0
    assert attrs(by["Qwen2.5-7B yarn"])["attention_factor"] == pytest.approx(0.1 * math.log(4.0) + 1.0)
    assert attrs(by["DeepSeek-V3 yarn"])["attention_factor"] == 1.0  # mscale over mscale_all_dim, both 1
    assert reference.rope_attention_factor("yarn", 4.0, 32768, attention_factor=0.5) == 0.5
    assert reference.rope_attention_factor("linear", 4.0, 32768, attention_factor=0.5) == 1.0


def hf_rotate(case: Case, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """transformers' rope of x [B, S, H, Dh] at positions [B, S]: its rotary embedding module (per-call
    frequencies through its dynamic update) and Phi-3's apply_rotary_pos_emb (partial rotary)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

    module = LlamaRotaryEmbedding(hf_config(case))
    xt = torch.from_numpy(x).transpose(1, 2)  # [B, H, S, Dh]
    cos, sin = module(xt, torch.from_numpy(positions).long())
    q, _ = apply_rotary_pos_emb(xt, xt, cos, sin)
    return q.transpose(1, 2).numpy()


def rotation_bound(x: np.ndarray, top: int, case: Case) -> np.ndarray:
    """Per element, how far two float32 ropes of x may differ at positions below `top`: 2 ulp(top) rad of
    angle times the norm of the pair the element rotates with (rotate-half pairs i and i + half)."""
    rd = case.attrs.get("rotary_dim") or case.head_dim
    half = rd // 2
    rot = x[..., :rd]
    pair = np.sqrt(rot[..., :half] ** 2 + rot[..., half:] ** 2)
    norm = np.concatenate([pair, pair, np.zeros_like(x[..., rd:])], axis=-1)
    scale = max(1.0, float(case.attrs.get("attention_factor", 1.0)))
    return 2.0 * float(np.spacing(np.float32(top))) * scale * norm + 1e-5


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_rope_op_matches_transformers(case: Case) -> None:
    rng = np.random.default_rng()
    b = GraphBuilder("rope")
    x_name = b.input("x", DType.F32, (2, 3, 2, case.head_dim))
    pos_name = b.input("positions", DType.I32, (2, 3))
    b.output("y", b.op("rope", "rope", x_name, pos_name, **attrs(case)))
    graph = b.build()
    x = rng.standard_normal((2, 3, 2, case.head_dim)).astype(np.float32)
    boundary = case.hf.get("original_max_position_embeddings", case.max_positions)
    # one call short of the scaling boundary, one past it (dynamic and longrope change there)
    for top in (boundary - 1, boundary + 40):
        positions = np.stack([np.arange(top - 2, top + 1), rng.integers(0, top, 3)]).astype(np.int32)
        got = reference.run(graph, {}, {"x": x, "positions": positions}, {})["y"]
        want = hf_rotate(case, x, positions)
        # Both sides form angles of up to `top` rad in float32, each within about one ulp of `top`
        # (the product and the f32 frequency), so an output may move by twice that ulp times the norm
        # of its rotated pair (x_i, x_{i+half}); a flat atol fails on the rare pair of norm ~4.
        np.testing.assert_array_less(
            np.abs(got - want), rotation_bound(x, top, case), err_msg=f"{case.source} top={top}"
        )
        if case.attrs.get("rotary_dim"):
            rd = case.attrs["rotary_dim"]
            assert np.array_equal(got[..., rd:], x[..., rd:]), "dims past rotary_dim pass through"


@pytest.mark.parametrize(
    ("bad", "fault"),
    [
        ({"rotary_dim": 7}, "rotary_dim must be even"),
        ({"rotary_dim": 18}, "exceeds head_dim"),
        ({"rope_type": "dynamic"}, "max_position_embeddings"),
        ({"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0] * 7}, "long_factor"),
        ({"rope_type": "ntk"}, "must be one of"),
        ({"short_factor": "1, 2"}, "must be floats"),
    ],
)
def test_bad_rope_attrs_are_refused(bad: dict[str, Any], fault: str) -> None:
    b = GraphBuilder("rope")
    x = b.input("x", DType.F32, (1, 1, 1, 16))
    pos = b.input("positions", DType.I32, (1, 1))
    with pytest.raises((OpError, GraphError), match=fault):
        b.output("y", b.op("rope", "rope", x, pos, **bad))
        b.build()
