"""polymorph.ir.reference against independent computations: torch, transformers and hand math."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as tf

from polymorph.errors import UserError
from polymorph.ir import DType, Graph, TensorType, reference
from polymorph.ir.builder import GraphBuilder
from polymorph.models.config import RopeConfig
from polymorph.verify.tolerance import Tolerance, compare, op_tolerance

F32, BF16, F16, I32, I64 = DType.F32, DType.BF16, DType.F16, DType.I32, DType.I64
FLOATS = [F32, BF16, F16]
Array = np.ndarray


def rand(rng: np.random.Generator, *shape: int, dtype: DType = F32, scale: float = 1.0) -> Array:
    return (scale * rng.standard_normal(shape)).astype(dtype.numpy)


def single(
    op: str,
    inputs: dict[str, Array],
    *,
    state: dict[str, Array] | None = None,
    n_out: int = 1,
    shapes: dict[str, tuple[int | str, ...]] | None = None,
    **attrs: Any,
) -> Graph:
    """A graph of one `op` node over `inputs` (then `state`) in that order; outputs out0.. outN."""
    g = GraphBuilder(op)
    names = []
    for name, arr in inputs.items():
        shape = (shapes or {}).get(name, arr.shape)
        names.append(g.input(name, DType.of(arr), shape))
    for name, arr in (state or {}).items():
        names.append(g.state(name, DType.of(arr), arr.shape))
    outs = tuple(f"out{i}" for i in range(n_out))
    g.op(op, op, *names, outputs=outs, **attrs)
    for o in outs:
        g.output(o, o)
    return g.build()


def run_single(op: str, inputs: dict[str, Array], n_out: int = 1, **attrs: Any) -> Any:
    graph = single(op, inputs, n_out=n_out, **attrs)
    outs = reference.run(graph, {}, inputs, {})
    types = graph.types()
    for name, value in graph.outputs.items():
        assert outs[name].dtype == types[value].dtype.numpy, f"{op}: {name} is not stored as {types[value]}"
    return outs["out0"] if n_out == 1 else tuple(outs[f"out{i}"] for i in range(n_out))


def assert_close(
    actual: Array, expected: Array | torch.Tensor, dtype: DType, tol: Tolerance | None = None
) -> None:
    if isinstance(expected, torch.Tensor):
        expected = expected.detach().double().numpy()
    result = compare(actual, np.asarray(expected, dtype=np.float64), tol or op_tolerance(dtype))
    assert result.ok, str(result)


def tt(x: Array) -> torch.Tensor:
    """A float64 torch tensor of `x` (the oracle computes in float64)."""
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


# --- norms -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_rmsnorm(dtype: DType) -> None:
    rng = np.random.default_rng(0)
    x, w = rand(rng, 2, 3, 64, dtype=dtype, scale=3.0), rand(rng, 64, dtype=dtype)
    got = run_single("rmsnorm", {"x": x, "w": w}, eps=1e-6)
    want = tf.rms_norm(tt(x), (64,), tt(w), eps=1e-6)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_layernorm(dtype: DType) -> None:
    rng = np.random.default_rng(1)
    x = (rand(rng, 4, 48, scale=2.0) + 5.0).astype(dtype.numpy)  # a mean far from 0
    w, b = rand(rng, 48, dtype=dtype), rand(rng, 48, dtype=dtype)
    got = run_single("layernorm", {"x": x, "w": w, "b": b}, eps=1e-5)
    want = tf.layer_norm(tt(x), (48,), tt(w), tt(b), eps=1e-5)
    assert_close(got, want, dtype)


# --- rope --------------------------------------------------------------------------------------------


def hf_rope(x: Array, positions: Array, inv_freq: Array) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb (rotate-half layout), in float64, x [B, S, H, Dh]."""
    angles = tt(positions)[..., None] * tt(inv_freq)  # [B, S, Dh/2]
    emb = torch.cat([angles, angles], dim=-1)[:, :, None, :]  # [B, S, 1, Dh]
    xt = tt(x)
    half = xt.shape[-1] // 2
    rotated = torch.cat([-xt[..., half:], xt[..., :half]], dim=-1)
    return xt * emb.cos() + rotated * emb.sin()


# f32 angles of positions up to ~300 carry ~2e-5 rad of rounding; the oracle is float64.
ROPE_TOL = Tolerance(rtol=1e-4, atol=1e-4)


def test_rope_default() -> None:
    rng = np.random.default_rng(2)
    x = rand(rng, 2, 5, 3, 16)
    positions = np.array([[0, 1, 2, 3, 4], [7, 100, 31, 250, 5]], dtype=np.int32)
    got = run_single("rope", {"x": x, "pos": positions}, theta=10000.0)
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)  # by hand
    assert_close(got, hf_rope(x, positions, inv_freq), F32, ROPE_TOL)
    # position 0 is the identity; the pairs (i, i + Dh/2) keep their norm
    np.testing.assert_allclose(got[0, 0], x[0, 0], rtol=0, atol=0)
    pair_norm = lambda a: np.hypot(a[..., :8], a[..., 8:])  # noqa: E731
    np.testing.assert_allclose(pair_norm(got), pair_norm(x), rtol=1e-5)


LLAMA3 = RopeConfig(
    theta=500000.0,
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=64,
)


def llama3_attrs(cfg: RopeConfig) -> dict[str, Any]:
    return {
        "theta": cfg.theta,
        "rope_type": cfg.rope_type,
        "factor": cfg.factor,
        "low_freq_factor": cfg.low_freq_factor,
        "high_freq_factor": cfg.high_freq_factor,
        "original_max_position_embeddings": cfg.original_max_position_embeddings,
    }


def test_rope_llama3() -> None:
    rng = np.random.default_rng(3)
    head_dim = 32
    x = rand(rng, 1, 6, 2, head_dim)
    positions = np.array([[0, 3, 17, 63, 64, 300]], dtype=np.int32)
    got = run_single("rope", {"x": x, "pos": positions}, **llama3_attrs(LLAMA3))
    inv_freq = LLAMA3.inv_freq(head_dim)
    default = RopeConfig(theta=LLAMA3.theta).inv_freq(head_dim)
    assert (inv_freq < default).any() and (inv_freq == default).any(), "some but not all bands are scaled"
    assert_close(got, hf_rope(x, positions, inv_freq), F32, ROPE_TOL)
    assert not np.allclose(got, run_single("rope", {"x": x, "pos": positions}, theta=LLAMA3.theta))


@pytest.mark.parametrize("head_dim", [16, 64, 128])
@pytest.mark.parametrize(
    "cfg", [LLAMA3, RopeConfig(500000.0, "llama3", 32.0, 1.0, 4.0, 8192)], ids=["tiny", "3.2"]
)
def test_rope_inv_freq_matches_transformers(cfg: RopeConfig, head_dim: int) -> None:
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import LlamaConfig

    hf_config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        rope_theta=cfg.theta,
        rope_scaling={k: v for k, v in llama3_attrs(cfg).items() if k != "theta"},
    )
    hf_inv_freq, attention_factor = rope_utils.ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    assert attention_factor == 1.0
    ours = reference.rope_inv_freq(head_dim, {**llama3_attrs(cfg)})
    np.testing.assert_allclose(ours, hf_inv_freq.double().numpy(), rtol=1e-6)
    np.testing.assert_allclose(cfg.inv_freq(head_dim), hf_inv_freq.double().numpy(), rtol=1e-6)


# --- attention ---------------------------------------------------------------------------------------


def sdpa(
    q: Array, k: Array, v: Array, scale: float, *, causal: bool = False, mask: Array | None = None
) -> Array:
    """torch SDPA in float64 on [B, S, H, Dh] tensors, grouped-query through enable_gqa."""
    qt, kt, vt = (tt(a).transpose(1, 2) for a in (q, k, v))  # [B, H, S, Dh]
    attn_mask = None if mask is None else torch.from_numpy(mask)[:, None]  # [B, 1, S, T]
    out = tf.scaled_dot_product_attention(
        qt, kt, vt, attn_mask=attn_mask, is_causal=causal, scale=scale, enable_gqa=True
    )
    return out.transpose(1, 2).numpy()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
def test_attention_causal_gqa(heads: int, kv_heads: int, dtype: DType) -> None:
    rng = np.random.default_rng(4)
    q = rand(rng, 2, 7, heads, 16, dtype=dtype)
    k, v = rand(rng, 2, 7, kv_heads, 16, dtype=dtype), rand(rng, 2, 7, kv_heads, 16, dtype=dtype)
    got = run_single("attention", {"q": q, "k": k, "v": v}, scale=0.25, causal=True)
    assert_close(got, sdpa(q, k, v, 0.25, causal=True), dtype)


def test_attention_not_causal_over_a_longer_context() -> None:
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, 1, 3, 4, 8), rand(rng, 1, 9, 2, 8), rand(rng, 1, 9, 2, 8)
    got = run_single("attention", {"q": q, "k": k, "v": v}, scale=1 / math.sqrt(8), causal=False)
    assert_close(got, sdpa(q, k, v, 1 / math.sqrt(8)), F32)


def test_attention_query_head_shares_the_kv_head_of_its_group() -> None:
    """Query head h reads kv head h // (H / Hkv), as transformers' repeat_kv lays them out."""
    rng = np.random.default_rng(6)
    q = rand(rng, 1, 1, 4, 8)
    k = rand(rng, 1, 5, 2, 8)
    v = np.zeros((1, 5, 2, 8), np.float32)
    v[:, :, 0], v[:, :, 1] = 1.0, 2.0  # every value of kv head j is j + 1
    got = run_single("attention", {"q": q, "k": k, "v": v}, scale=1.0, causal=False)
    np.testing.assert_allclose(got[0, 0, :, 0], [1.0, 1.0, 2.0, 2.0], rtol=1e-6)


def shuffled_table(rng: np.random.Generator, batch: int, ctx_blocks: int, cache_blocks: int) -> Array:
    return rng.permutation(cache_blocks)[: batch * ctx_blocks].reshape(batch, ctx_blocks).astype(np.int32)


def paged(
    rng: np.random.Generator, kv: Array, table: Array, lengths: list[int], cache_blocks: int, block_size: int
) -> Array:
    """Scatter contiguous kv [B, T, Hkv, Dh] into a garbage-filled paged cache through `table`."""
    cache = rand(rng, cache_blocks, block_size, *kv.shape[2:], scale=50.0)  # garbage the mask must hide
    for b, length in enumerate(lengths):
        for p in range(length):
            cache[table[b, p // block_size], p % block_size] = kv[b, p]
    return cache


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_cache_attention_prefill_equals_causal_attention(kv_heads: int) -> None:
    rng = np.random.default_rng(7)
    b, s, heads, d, bs, cache_blocks = 2, 11, 4, 8, 4, 9
    q, k, v = rand(rng, b, s, heads, d), rand(rng, b, s, kv_heads, d), rand(rng, b, s, kv_heads, d)
    table = shuffled_table(rng, b, 3, cache_blocks)
    kc, vc = (paged(rng, kv, table, [s, s], cache_blocks, bs) for kv in (k, v))
    positions = np.tile(np.arange(s, dtype=np.int32), (b, 1))
    got = run_single(
        "cache_attention", {"q": q, "kc": kc, "vc": vc, "table": table, "pos": positions}, scale=0.3
    )
    plain = run_single("attention", {"q": q, "k": k, "v": v}, scale=0.3, causal=True)
    assert_close(got, plain, F32)
    assert_close(got, sdpa(q, k, v, 0.3, causal=True), F32)


def test_cache_attention_ragged_decode_and_chunked_prefill() -> None:
    """Sequences of lengths 13 and 6; the last 3 tokens of each attend over their own prefix."""
    rng = np.random.default_rng(8)
    lengths, s, heads, kv_heads, d, bs, ctx_blocks = [13, 6], 3, 4, 2, 8, 4, 4
    t = max(lengths)
    q = rand(rng, 2, s, heads, d)
    k, v = rand(rng, 2, t, kv_heads, d), rand(rng, 2, t, kv_heads, d)
    table = shuffled_table(rng, 2, ctx_blocks, 10)
    kc, vc = (paged(rng, kv, table, lengths, 10, bs) for kv in (k, v))
    positions = np.array([[length - s + j for j in range(s)] for length in lengths], dtype=np.int32)
    got = run_single(
        "cache_attention", {"q": q, "kc": kc, "vc": vc, "table": table, "pos": positions}, scale=0.3
    )
    mask = np.arange(t)[None, None, :] <= positions[:, :, None]  # [B, S, T]
    assert_close(got, sdpa(q, k, v, 0.3, mask=mask), F32)


def test_cache_attention_ignores_what_invisible_slots_hold() -> None:
    rng = np.random.default_rng(9)
    q = rand(rng, 1, 1, 2, 4)
    kc, vc = rand(rng, 3, 2, 1, 4), rand(rng, 3, 2, 1, 4)
    table = np.array([[2, 0]], dtype=np.int32)
    positions = np.array([[1]], dtype=np.int32)  # sees slots 0 and 1 of block 2 only
    inputs = {"q": q, "kc": kc, "vc": vc, "table": table, "pos": positions}
    clean = run_single("cache_attention", inputs, scale=0.5)
    kc[0], vc[0], kc[1], vc[1] = np.nan, np.nan, np.inf, -np.inf
    poisoned = run_single("cache_attention", inputs, scale=0.5)
    np.testing.assert_array_equal(poisoned, clean)


# --- kv_write ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_kv_write_slot_addressing(dtype: DType) -> None:
    rng = np.random.default_rng(10)
    bs, hkv, d = 4, 2, 3
    cache = np.zeros((6, bs, hkv, d), dtype.numpy)
    x = rand(rng, 2, 3, hkv, d, dtype=dtype)
    table = np.array([[5, 2, 0], [1, 4, 3]], dtype=np.int32)
    positions = np.array([[3, 4, 9], [0, 5, 6]], dtype=np.int32)
    g = GraphBuilder("kv_write")
    c = g.state("cache", dtype, cache.shape)
    out = g.op(
        "kv_write",
        "w",
        c,
        g.input("x", dtype, x.shape),
        g.input("table", I32, (2, 3)),
        g.input("pos", I32, (2, 3)),
    )
    g.update("cache", out)
    g.output("cache", out)
    state = {"cache": cache}
    outs = reference.run(g.build(), {}, {"x": x, "table": table, "pos": positions}, state)
    assert state["cache"] is cache, "the state is written in place"
    assert outs["cache"].dtype == dtype.numpy
    expected = np.zeros_like(cache)
    # (b, s) -> block table[b, p // 4], slot p % 4
    slots = {(0, 0): (5, 3), (0, 1): (2, 0), (0, 2): (0, 1), (1, 0): (1, 0), (1, 1): (4, 1), (1, 2): (4, 2)}
    for (b, s), (block, slot) in slots.items():
        expected[block, slot] = x[b, s]
    np.testing.assert_array_equal(cache.astype(np.float32), expected.astype(np.float32))


def test_kv_write_outside_the_block_table_is_a_user_error() -> None:
    g = GraphBuilder("kv_write")
    c = g.state("cache", F32, (4, 2, 1, 1))
    out = g.op(
        "kv_write",
        "w",
        c,
        g.input("x", F32, (1, 1, 1, 1)),
        g.input("table", I32, (1, 2)),
        g.input("pos", I32, (1, 1)),
    )
    g.update("cache", out)
    g.output("cache", out)
    graph = g.build()
    for bad in (4, -1):  # the table holds 2 blocks of 2: positions 0..3
        with pytest.raises(UserError, match="outside the block table"):
            reference.run(
                graph,
                {},
                {
                    "x": np.ones((1, 1, 1, 1), np.float32),
                    "table": np.array([[0, 1]], np.int32),
                    "pos": np.array([[bad]], np.int32),
                },
                {"cache": np.zeros((4, 2, 1, 1), np.float32)},
            )


def test_value_read_from_state_before_a_kv_write_keeps_its_content() -> None:
    g = GraphBuilder("alias")
    c = g.state("c", F32, (1, 2, 1, 1))
    before = g.op("reshape", "before", c, shape=(2,))
    written = g.op(
        "kv_write",
        "w",
        c,
        g.input("x", F32, (1, 1, 1, 1)),
        g.input("t", I32, (1, 1)),
        g.input("p", I32, (1, 1)),
    )
    g.update("c", written)
    g.output("y", g.op("add", "y", before, before))
    outs = reference.run(
        g.build(),
        {},
        {
            "x": np.ones((1, 1, 1, 1), np.float32),
            "t": np.zeros((1, 1), np.int32),
            "p": np.zeros((1, 1), np.int32),
        },
        {"c": np.zeros((1, 2, 1, 1), np.float32)},
    )
    np.testing.assert_array_equal(outs["y"], [0.0, 0.0])


# --- moe ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3])
def test_topk_router_topk_softmax(k: int) -> None:
    rng = np.random.default_rng(11)
    logits = rand(rng, 2, 3, 8, scale=2.0)
    weights, idx = run_single("topk_router", {"logits": logits}, n_out=2, k=k, mode="topk_softmax")
    vals, want_idx = torch.topk(tt(logits), k, dim=-1)
    assert idx.dtype == np.int32 and weights.dtype == np.float32
    np.testing.assert_array_equal(idx, want_idx.numpy())
    assert_close(weights, torch.softmax(vals, dim=-1), F32)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_topk_router_softmax_topk(normalize: bool, dtype: DType) -> None:
    rng = np.random.default_rng(12)
    logits = rand(rng, 5, 8, dtype=dtype, scale=2.0)
    weights, idx = run_single(
        "topk_router", {"logits": logits}, n_out=2, k=2, mode="softmax_topk", normalize=normalize
    )
    probs = torch.softmax(tt(logits), dim=-1)
    vals, want_idx = torch.topk(probs, 2, dim=-1)
    if normalize:
        vals = vals / vals.sum(dim=-1, keepdim=True)
        np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-6)
    else:
        assert (weights.sum(axis=-1) < 1.0).all()
    assert weights.dtype == np.float32, "routing weights are f32 whatever the logits are"
    np.testing.assert_array_equal(idx, want_idx.numpy())
    assert_close(weights, vals, F32)


def test_topk_softmax_is_softmax_topk_renormalized() -> None:
    """Mixtral's routing equals Qwen3-MoE's with norm_topk_prob (the config docstring's claim)."""
    logits = rand(np.random.default_rng(13), 4, 6, 8)
    a = run_single("topk_router", {"logits": logits}, n_out=2, k=3, mode="topk_softmax")
    b = run_single("topk_router", {"logits": logits}, n_out=2, k=3, mode="softmax_topk", normalize=True)
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_allclose(a[0], b[0], rtol=1e-6)


def moe_loop(x: Array, weights: Array, idx: Array, wg: Array, wu: Array, wd: Array) -> Array:
    """sum_k weight * down(silu(gate x) * up x), one token and one routing slot at a time, float64."""
    xs = x.reshape(-1, x.shape[-1]).astype(np.float64)
    ws, ids = weights.reshape(-1, weights.shape[-1]).astype(np.float64), idx.reshape(-1, idx.shape[-1])
    out = np.zeros_like(xs)
    for tok in range(xs.shape[0]):
        for slot in range(ids.shape[1]):
            e = ids[tok, slot]
            gate = wg[e].astype(np.float64) @ xs[tok]
            up = wu[e].astype(np.float64) @ xs[tok]
            act = gate / (1 + np.exp(-gate)) * up
            out[tok] += ws[tok, slot] * (wd[e].astype(np.float64) @ act)
    return out.reshape(x.shape)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_moe_ffn_matches_a_per_token_loop(dtype: DType) -> None:
    rng = np.random.default_rng(14)
    e, k, f, d = 5, 2, 12, 8
    x = rand(rng, 2, 3, d, dtype=dtype)
    idx = np.stack([rng.permutation(e)[:k] for _ in range(6)]).reshape(2, 3, k).astype(np.int32)
    idx[1, 2] = [4, 4]  # one token routed twice to one expert: both slots count
    weights = rng.random((2, 3, k)).astype(np.float32)
    wg, wu, wd = (
        rand(rng, e, f, d, dtype=dtype),
        rand(rng, e, f, d, dtype=dtype),
        rand(rng, e, d, f, dtype=dtype),
    )
    inputs = {"x": x, "w": weights, "idx": idx, "wg": wg, "wu": wu, "wd": wd}
    got = run_single("moe_ffn", inputs)
    assert got.dtype == dtype.numpy
    assert_close(got, moe_loop(x, weights, idx, wg, wu, wd), dtype)


def test_moe_ffn_unused_experts_do_not_matter() -> None:
    rng = np.random.default_rng(15)
    x, weights = rand(rng, 4, 8), rng.random((4, 1)).astype(np.float32)
    idx = np.array([[0], [2], [0], [2]], dtype=np.int32)
    wg, wu, wd = rand(rng, 3, 6, 8), rand(rng, 3, 6, 8), rand(rng, 3, 8, 6)
    inputs = {"x": x, "w": weights, "idx": idx, "wg": wg, "wu": wu, "wd": wd}
    clean = run_single("moe_ffn", inputs)
    wg[1] = wu[1] = np.nan
    wd[1] = np.nan
    np.testing.assert_array_equal(run_single("moe_ffn", inputs), clean)


# --- layout, cast, argmax ----------------------------------------------------------------------------


def test_slice_negative_start_on_a_symbolic_dim() -> None:
    g = GraphBuilder("last")
    x = g.input("x", F32, ("batch", "seq", 4))
    g.output("y", g.op("slice", "last", x, axis=1, start=-2, end=None))
    graph = g.build()
    assert graph.types()["last"] == TensorType(F32, ("batch", 2, 4))
    for seq in (2, 5):
        arr = rand(np.random.default_rng(seq), 3, seq, 4)
        got = reference.run(graph, {}, {"x": arr}, {})["y"]
        np.testing.assert_array_equal(got, arr[:, -2:])


@pytest.mark.parametrize(("start", "end"), [(1, 3), (-3, -1), (0, None), (-4, None), (2, 100)])
def test_slice_concrete(start: int, end: int | None) -> None:
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    np.testing.assert_array_equal(
        run_single("slice", {"x": x}, axis=-1, start=start, end=end), x[:, start:end]
    )


@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=str)
def test_concat(dtype: DType) -> None:
    rng = np.random.default_rng(16)
    parts = {
        f"p{i}": rand(rng, 2, n, 3, dtype=F32, scale=10.0).astype(dtype.numpy)
        for i, n in enumerate([1, 4, 2])
    }
    got = run_single("concat", parts, axis=1)
    np.testing.assert_array_equal(got, np.concatenate(list(parts.values()), axis=1))
    assert got.dtype == dtype.numpy
    got = run_single("concat", {"a": parts["p0"], "b": parts["p0"]}, axis=-3)
    assert got.shape == (4, 1, 3)


def test_reshape_and_transpose() -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    g = GraphBuilder("layout")
    v = g.input("x", F32, ("batch", 3, 4))
    r = g.op("reshape", "r", v, shape=("batch", 12))
    g.output("r", r)
    g.output("t", g.op("transpose", "t", v, perm=(2, 0, 1)))
    outs = reference.run(g.build(), {}, {"x": x}, {})
    np.testing.assert_array_equal(outs["r"], x.reshape(2, 12))
    np.testing.assert_array_equal(outs["t"], x.transpose(2, 0, 1))


def bits(x: Array) -> Array:
    return x.view(np.uint16)


def test_cast_to_bf16_rounds_to_nearest_even() -> None:
    one = 1.0
    values = np.array(
        [
            one + 2**-8,  # halfway between 1 and 1 + 2^-7: even mantissa is 1
            one + 3 * 2**-8,  # halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6
            one + 2**-8 + 2**-20,  # just above halfway: up
            one + 2**-8 - 2**-20,  # just below halfway: down
            -(one + 3 * 2**-8),
            np.finfo(np.float32).max,  # rounds past bf16's largest finite value
            1e-40,  # an f32 subnormal
            0.0,
        ],
        dtype=np.float32,
    )
    got = run_single("cast", {"x": values}, dtype="bf16")
    assert got.dtype == ml_dtypes.bfloat16
    want = np.array([1.0, 1 + 2**-6, 1 + 2**-7, 1.0, -(1 + 2**-6)], dtype=np.float32)
    np.testing.assert_array_equal(got[:5].astype(np.float32), want)
    assert np.isinf(got[5].astype(np.float32))
    oracle = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bits(got), oracle)


def test_cast_random_f32_to_bf16_and_f16_matches_torch() -> None:
    x = rand(np.random.default_rng(17), 1000, scale=100.0)
    got = run_single("cast", {"x": x}, dtype="bfloat16")  # the dtype attr takes aliases
    np.testing.assert_array_equal(
        bits(got), torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    )
    got = run_single("cast", {"x": x}, dtype="f16")
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, torch.from_numpy(x).half().numpy())
    back = run_single("cast", {"x": got}, dtype="f32")
    np.testing.assert_array_equal(back, got.astype(np.float32))


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("dtype", [F32, BF16, I64], ids=str)
def test_argmax_is_i32(axis: int, dtype: DType) -> None:
    x = np.random.default_rng(18).permutation(60).reshape(3, 4, 5).astype(dtype.numpy)
    got = run_single("argmax", {"x": x}, axis=axis)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.argmax(x.astype(np.float64), axis=axis))


# --- elementwise, projections, and bf16 storage ------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "attrs", "oracle"),
    [
        ("silu", {}, tf.silu),
        ("gelu", {}, tf.gelu),
        ("gelu", {"approximate": "tanh"}, lambda x: tf.gelu(x, approximate="tanh")),
        ("softmax", {"axis": 0}, lambda x: torch.softmax(x, dim=0)),
        ("softmax", {}, lambda x: torch.softmax(x, dim=-1)),
    ],
    ids=["silu", "gelu", "gelu-tanh", "softmax-0", "softmax"],
)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_unary(op: str, attrs: dict[str, Any], oracle: Any, dtype: DType) -> None:
    x = rand(np.random.default_rng(19), 6, 7, dtype=dtype, scale=3.0)
    assert_close(run_single(op, {"x": x}, **attrs), oracle(tt(x)), dtype)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_linear_and_matmul(bias: bool, dtype: DType) -> None:
    rng = np.random.default_rng(20)
    x, w = rand(rng, 2, 3, 16, dtype=dtype), rand(rng, 10, 16, dtype=dtype)
    inputs = {"x": x, "w": w}
    if bias:
        inputs["b"] = rand(rng, 10, dtype=dtype)
    want = tf.linear(tt(x), tt(w), tt(inputs["b"]) if bias else None)
    assert_close(run_single("linear", inputs), want, dtype)
    b = rand(rng, 2, 16, 5, dtype=dtype)
    assert_close(run_single("matmul", {"a": x, "b": b}), tt(x) @ tt(b), dtype)


def test_embedding_gathers_rows() -> None:
    table = rand(np.random.default_rng(21), 10, 4, dtype=BF16)
    ids = np.array([[3, 0, 9], [3, 3, 1]], dtype=np.int64)
    got = run_single("embedding", {"table": table, "ids": ids})
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.astype(np.float32), table[ids].astype(np.float32))


def test_bf16_graph_stores_every_value_as_bf16() -> None:
    """Each op computes in f32 and its result is rounded to bf16 where it is stored, not later."""
    rng = np.random.default_rng(22)
    a, b, c = (rand(rng, 64, dtype=BF16, scale=10.0) for _ in range(3))
    g = GraphBuilder("bf16")
    va, vb, vc = (g.input(n, BF16, (64,)) for n in "abc")
    s = g.op("add", "s", va, vb)
    m = g.op("mul", "m", s, vc)
    g.output("s", s)
    g.output("m", m)
    g.output("m32", g.op("cast", "m32", m, dtype="f32"))
    outs = reference.run(g.build(), {}, {"a": a, "b": b, "c": c}, {})
    assert outs["s"].dtype == outs["m"].dtype == ml_dtypes.bfloat16
    assert outs["m32"].dtype == np.float32
    f = lambda x: x.astype(np.float32)  # noqa: E731
    rounded = f((f(a) + f(b)).astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(f(outs["s"]), rounded)
    np.testing.assert_array_equal(f(outs["m"]), f((rounded * f(c)).astype(ml_dtypes.bfloat16)))
    np.testing.assert_array_equal(outs["m32"], f(outs["m"]))
    unrounded = f(((f(a) + f(b)) * f(c)).astype(ml_dtypes.bfloat16))
    assert not np.array_equal(f(outs["m"]), unrounded), "the intermediate sum was rounded to bf16"


def test_reference_rejects_arrays_that_contradict_the_graph() -> None:
    graph = single(
        "add",
        {"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.float32)},
        shapes={"a": ("n", 3), "b": ("n", 3)},
    )
    ok = {"a": np.zeros((2, 3), np.float32), "b": np.ones((2, 3), np.float32)}
    np.testing.assert_array_equal(reference.run(graph, {}, ok, {})["out0"], ok["b"])
    for bad, match in [
        ({"a": ok["a"]}, "needs `b`"),
        ({**ok, "b": np.ones((2, 3), np.float64)}, "`b` is float64"),
        ({**ok, "b": np.ones((3, 3), np.float32)}, "gives n=3, another input gave n=2"),
        ({**ok, "b": np.ones((2, 4), np.float32)}, "the graph declares"),
    ]:
        with pytest.raises(UserError, match=match):
            reference.run(graph, {}, bad, {})


@pytest.mark.parametrize("op", ["add", "mul"])
def test_integer_arithmetic_is_exact(op: str) -> None:
    a = np.array([2**24 + 1, 123456789], dtype=np.int32)
    b = np.array([0 if op == "add" else 1, 0 if op == "add" else 1], dtype=np.int32)
    np.testing.assert_array_equal(run_single(op, {"a": a, "b": b}), a)


@pytest.mark.parametrize("bad_id", [-1, 3])
def test_embedding_id_outside_the_vocab_is_a_user_error(bad_id: int) -> None:
    table = np.arange(6, dtype=np.float32).reshape(3, 2)
    with pytest.raises(UserError):
        run_single("embedding", {"table": table, "ids": np.array([0, bad_id], dtype=np.int32)})


@pytest.mark.parametrize("model", ["llama-tiny", "moe-tiny"])
def test_f32_weight_copies_change_no_bit_of_a_step(model: str) -> None:
    """ReferenceExecutable keeps f32 copies of bf16 projection weights (`reference.WIDE_OPS` read
    them): the logits are the same bits as converting the weights at every call."""
    from polymorph.models import load_model
    from polymorph.serving.session import ReferenceExecutable

    m = load_model(model, dtype="bf16")
    rng = np.random.default_rng()
    vocab = int(m.graph.params["model.embed_tokens.weight"].shape[0])
    wide, narrow = (
        ReferenceExecutable(m.graph, m.weights()),
        ReferenceExecutable(m.graph, m.weights(), wide_budget=0),
    )
    assert wide.wide and not narrow.wide
    assert all(a.dtype == np.float32 for a in wide.wide.values())
    for exe in (wide, narrow):
        exe.allocate_state(4)
    inputs = {
        "tokens": rng.integers(0, vocab, (1, 5), dtype=np.int32),
        "positions": np.arange(5, dtype=np.int32)[None],
        "block_table": np.array([[1, 2, 3]], dtype=np.int32),
    }
    np.testing.assert_array_equal(wide.run(inputs)["logits"], narrow.run(inputs)["logits"])
