"""Conformance entries for the routers and experts of the MoE families (ops._ROUTER, ops._EXPERTS):
conftest.py's `_entries()` adds them, passing its own helpers (OpInfo, one_node, inp, par,
leaf_samples, ...), as this file cannot import conftest under --import-mode=importlib.

Router indices must match the reference exactly, so every router sample has an unambiguous
selection: a mode that selects on the logits themselves (topk_softmax, topk_sigmoid) needs only
distinct logits (an exact comparison of the same values in every backend); a mode that selects on
computed scores (softmax probabilities, sigmoid scores + bias, group sums) needs its selection margins
above the few f32 ulps by which two implementations of exp may differ. `_router_fix` redraws each row
that lacks them, after shaping the logits (near ties, an imbalance) and rounding them to the input
dtype, as the kernels see them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from polymorph.ir.dtypes import DType

F32, BF16, F16, I32 = DType.F32, DType.BF16, DType.F16, DType.I32

# The smallest gap (absolute, on scores in (0, 1] or on logits for softmax) that a selection by
# computed scores must keep: f32 sigmoid / exp of two implementations differ by a few 1e-7.
SCORE_MARGIN = 1e-5
LOGIT_MARGIN = 1e-4  # softmax_topk: a logit gap d is a relative probability gap of ~d

Shaper = Callable[[np.ndarray, np.random.Generator, int], np.ndarray]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.float32(1) / (np.float32(1) + np.exp(-x))


def _gaps_clear(values: np.ndarray, n: int, margin: float) -> bool:
    """The n + 1 largest of values[E] (descending) are each more than `margin` apart (n + 1 capped at E;
    a gap to -inf is clear)."""
    top = np.sort(values)[::-1][: min(n + 1, values.size)].astype(np.float64)
    finite = top[np.isfinite(top)]
    return bool(np.all(-np.diff(finite) > margin))


def selection_clear(row: np.ndarray, bias: np.ndarray | None, attrs: Mapping[str, Any]) -> bool:
    """Whether the router's choice of experts (and their order) for logits row[E] (f32) is unambiguous."""
    mode, k = attrs.get("mode", "topk_softmax"), attrs["k"]
    if mode in ("topk_softmax", "topk_sigmoid"):
        return _gaps_clear(row, k, 0.0)
    if mode == "softmax_topk":
        return _gaps_clear(row, k, LOGIT_MARGIN)
    choice = _sigmoid(row)
    if bias is not None:
        choice = choice + bias
    groups = attrs.get("groups", 1)
    if groups > 1:
        chosen = attrs.get("topk_groups", 0) or groups
        grouped = choice.reshape(groups, -1)
        best2 = np.sort(grouped, axis=-1)[:, ::-1][:, :2].sum(axis=-1)
        if chosen < groups and not _gaps_clear(best2, chosen - 1, SCORE_MARGIN):
            return False
        keep = np.argsort(-best2, kind="stable")[:chosen]
        allowed = np.zeros(groups, dtype=bool)
        allowed[keep] = True
        choice = np.where(np.repeat(allowed, choice.size // groups), choice, -np.inf)
    return _gaps_clear(choice, k, SCORE_MARGIN)


def _normal(base: np.ndarray, rng: np.random.Generator, hot: int) -> np.ndarray:
    return base


def near_ties(base: np.ndarray, rng: np.random.Generator, hot: int) -> np.ndarray:
    """Rows of c + j/128 (c in -1, 0, 1; j a permutation of the experts): every logit one step of 1/128
    from the next, exact in bf16 and f16, so close but distinct."""
    n, e = base.shape
    c = rng.choice(np.array([-1.0, 0.0, 1.0]), (n, 1))
    return (c + np.argsort(rng.random((n, e)), axis=-1) / 128.0).astype(np.float32)


def imbalanced(base: np.ndarray, rng: np.random.Generator, hot: int) -> np.ndarray:
    """Normal logits where ~90% of the tokens prefer expert `hot` (one per sample) by +3."""
    rows = rng.random(base.shape[0]) < 0.9
    out = rng.standard_normal(base.shape).astype(np.float32)
    out[rows, hot] += 3.0
    return out


def _router_fix(attrs: Mapping[str, Any], shape: Shaper = _normal):
    """leaf_samples' `fix`: shape the logits, then redraw (shaped again) each row whose selection is not
    clear, judged on the logits rounded to their dtype and the bias as given."""

    def fix(arrays: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        x = arrays["logits"]
        e = x.shape[-1]
        flat = x.reshape(-1, e).astype(np.float32)
        hot = int(rng.integers(e))
        rows = shape(flat, rng, hot).astype(x.dtype)
        bias = arrays["bias"].astype(np.float32) if "bias" in arrays else None
        for r in range(rows.shape[0]):
            for _ in range(1000):
                if selection_clear(rows[r].astype(np.float32), bias, attrs):
                    break
                redraw = shape(2.0 * rng.standard_normal((1, e)).astype(np.float32), rng, hot)
                rows[r] = redraw[0].astype(x.dtype)
            else:
                raise AssertionError(f"no clear router selection found for {dict(attrs)} with bias {bias}")
        arrays["logits"] = rows.reshape(x.shape)

    return fix


def hot_experts(k: int, share: float = 0.9):
    """k distinct experts per token, one expert (per sample) among them for ~`share` of the tokens."""

    def gen(rng: np.random.Generator, shape: tuple[int, ...], sizes: Mapping[str, int]) -> np.ndarray:
        e = sizes["experts"]
        keys = rng.random((*shape[:-1], e))
        hot = rng.integers(e)
        keys[..., hot] = np.where(rng.random(shape[:-1]) < share, -1.0, keys[..., hot])
        return np.argsort(keys, axis=-1)[..., :k]

    return gen


def any_experts(k: int):
    """k experts per token drawn with repeats (a token may name one twice)."""

    def gen(rng: np.random.Generator, shape: tuple[int, ...], sizes: Mapping[str, int]) -> np.ndarray:
        idx = rng.integers(0, sizes["experts"], shape)
        idx[..., 1] = idx[..., 0]  # every token repeats its first expert
        return idx

    return gen


def entries(ns: Mapping[str, Any]) -> list[Any]:
    OpInfo, one_node, inp, par, leaf_samples = (
        ns[k] for k in ("OpInfo", "one_node", "inp", "par", "leaf_samples")
    )
    distinct_experts, tied_router_logits, FLOATS = (
        ns[k] for k in ("distinct_experts", "tied_router_logits", "FLOATS")
    )
    rows = [{"batch": 1}, {"batch": 7}]
    many = [{"batch": 16}, {"batch": 33}]  # an imbalance needs tokens
    e: list[Any] = []

    # --- routers: logits[batch, E] (, bias[E]): the bias is an input, not a param, so that
    # test_weights_live (which negates params) cannot break the margins the samples were drawn with.
    def router(
        name: str,
        experts: int = 8,
        *,
        bias: bool = False,
        shape: Shaper = _normal,
        sizes=rows,
        dists=("normal", "uniform", "outliers"),
        **attrs: Any,
    ) -> None:
        def build(d: DType) -> Any:
            leaves = {"logits": inp(d, "batch", experts)}
            if bias:
                leaves["bias"] = inp(d, experts)
            return one_node("topk_router", leaves, outputs=("weights", "indices"), **attrs)

        samples = leaf_samples(
            sizes, wide=["logits"], large=8.0, dists=dists, scale={"bias": 0.5}, fix=_router_fix(attrs, shape)
        )
        e.append(OpInfo(f"topk_router.{name}", "topk_router", build, samples, dtypes=FLOATS))

    router("topk_softmax_scaled", k=2, scaling=2.5)
    router("softmax_topk_scaled", k=3, mode="softmax_topk", normalize=True, scaling=0.5)
    router("topk_sigmoid", k=1, mode="topk_sigmoid")  # Llama 4
    router("topk_sigmoid_k2_scaled", k=2, mode="topk_sigmoid", scaling=1.5)
    router("sigmoid_topk", k=2, mode="sigmoid_topk")
    router("sigmoid_topk_bias", k=2, mode="sigmoid_topk", bias=True)
    router("sigmoid_topk_bias_norm", k=3, mode="sigmoid_topk", bias=True, normalize=True, scaling=2.5)
    # DeepSeek-V3's shape in small: 16 experts in 4 groups, the best 2 groups kept, 4 experts chosen
    for tag, kw in (("", {}), ("_bias", {"bias": True})):
        router(f"sigmoid_topk_groups{tag}", 16, k=4, mode="sigmoid_topk", groups=4, topk_groups=2,
               normalize=True, scaling=2.5, **kw)  # fmt: skip
    router("sigmoid_topk_groups_all", 16, k=4, mode="sigmoid_topk", bias=True, groups=4, topk_groups=0)
    router("sigmoid_topk_groups_one", 16, k=2, mode="sigmoid_topk", bias=True, groups=8, topk_groups=1)
    for mode, k in (("topk_softmax", 2), ("softmax_topk", 2), ("topk_sigmoid", 1), ("sigmoid_topk", 2)):
        norm = {"normalize": True} if mode in ("softmax_topk", "sigmoid_topk") else {}
        router(f"near_ties.{mode}", k=k, mode=mode, shape=near_ties, dists=("normal",), **norm)
        router(f"imbalanced.{mode}", k=k, mode=mode, shape=imbalanced, sizes=many, dists=("normal",), **norm)
    router("near_ties.sigmoid_topk_groups", 16, k=4, mode="sigmoid_topk", groups=4, topk_groups=2,
           shape=near_ties, dists=("normal",))  # fmt: skip
    router("imbalanced.sigmoid_topk_bias", k=2, mode="sigmoid_topk", bias=True, normalize=True,
           shape=imbalanced, sizes=many, dists=("normal",))  # fmt: skip
    # exact ties: a selection on the logits themselves goes to the lower index in every backend
    e.append(OpInfo("topk_router.ties.topk_sigmoid", "topk_router",
                    lambda d: one_node("topk_router", {"logits": inp(d, "batch", 8)},
                                       outputs=("weights", "indices"), k=3, mode="topk_sigmoid"),
                    leaf_samples(rows, dists=("normal",), fix=tied_router_logits)))  # fmt: skip

    # --- experts: x[batch, 16], k of E experts per token, ffn 24 (as conftest's moe_ffn entry)
    def moe(name: str, *, k: int = 2, experts: int = 4, biases: bool = False, sizes=None, ints=None,
            **attrs: Any) -> None:  # fmt: skip
        def build(d: DType) -> Any:
            leaves = {
                "x": inp(d, "batch", 16),
                "weights": inp(F32, "batch", k),
                "indices": inp(I32, "batch", k),
                "w_gate": par(d, experts, 24, 16),
                "w_up": par(d, experts, 24, 16),
                "w_down": par(d, experts, 16, 24),
            }
            if biases:
                ffn_bias, out_bias = par(d, experts, 24), par(d, experts, 16)
                leaves.update(b_gate=ffn_bias, b_up=ffn_bias, b_down=out_bias)
            return one_node("moe_ffn", leaves, **attrs)

        size = sizes or [{"batch": 1}, {"batch": 7}]
        samples = leaf_samples(
            [{**s, "experts": experts} for s in size],
            wide=["x"],
            large=10.0,
            ints={"indices": (ints or distinct_experts)(k)},
            scale={"w_gate": 0.25, "w_up": 0.25, "w_down": 0.2, "b_gate": 0.5, "b_up": 0.5, "b_down": 0.5},
        )
        e.append(OpInfo(f"moe_ffn.{name}", "moe_ffn", build, samples, dtypes=FLOATS))

    moe("bias", biases=True)
    # gpt-oss: g and u are ~N(0, 1) for normal x (16 terms of 0.25), so a limit of 1 clamps about a
    # third of them, and the "uniform" and "outliers" samples (x up to 10) most of them
    moe("swiglu_clamp", activation="swiglu_clamp", limit=1.0)
    moe("swiglu_clamp_bias", biases=True, activation="swiglu_clamp", alpha=1.702, limit=1.0)
    moe("weight_input", k=1, weight_input=True)  # Llama 4
    moe("weight_input_k2", weight_input=True, biases=True)
    moe("swiglu_clamp_weight_input", k=3, experts=8, biases=True, activation="swiglu_clamp", alpha=1.0,
        limit=1.5, weight_input=True)  # fmt: skip
    # the op allows a token to name an expert twice (no router does): each slot is its own term
    moe("repeated_experts", k=3, ints=any_experts, biases=True)
    moe("repeated_experts_weight_input", k=3, ints=any_experts, weight_input=True, activation="swiglu_clamp",
        limit=1.0)  # fmt: skip
    moe("imbalanced", experts=8, sizes=many, ints=hot_experts)
    moe("imbalanced_clamp_bias", k=4, experts=8, sizes=many, ints=hot_experts, biases=True,
        activation="swiglu_clamp", limit=1.0)  # fmt: skip
    return e
