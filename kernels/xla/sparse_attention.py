"""DeepSeek-V3.2's sparse attention: the indexer's top-k over the paged indexer cache, and attention
over only the positions it selected, in float32 (q·k keeps the stored operand dtype and accumulates in
f32, as kernels/xla/attention.py does).

indexer_topk: the keys of the blocks in the block table are gathered (an HLO gather) into [B, T, D];
scores[B, S, T] = sum_h weights * relu(scale q_h . k_t), -inf past each query's position, signed zeros
made +0 (a sum of w * 0 may be -0); an HLO TopK (largest first, the lower index first on ties) takes
the k best, -1 where fewer are visible.

index_attention: each query sees the positions of its row of `selected` that lie in [0, its own
position] (-1 and any other position outside: none; a position listed twice counts once). k_cache and
v_cache may be the same array (DeepSeek's latent cache), gathered once then. A slot no query sees may
hold anything (NaN included): its scores are masked to -inf and its value rows zeroed before P·V, since
0 * NaN is NaN. Static shapes throughout, no host callbacks.
"""

import jax.numpy as jnp
from jax import dtypes, lax

IMPLEMENTS = ("indexer_topk", "index_attention")
# read (index_attention): "slots" gathers the k selected slots of each query ([B, S, k] rows of the
# cache, through the block table; a sort finds repeated entries); "table" gathers every block of the
# block table once (as cache_attention does) and masks what a query did not select.
CONFIGS = [{"read": "slots"}, {"read": "table"}]
HIGHEST = lax.Precision.HIGHEST

# the attrs this file implements (an attr added to an op later is refused until it is)
_ATTRS = {"indexer_topk": {"k", "scale"}, "index_attention": {"scale"}}


def supports(spec):
    return len(spec.nodes) == 1 and set(spec.attrs()) <= _ATTRS.get(spec.single.op, set())


def _operands(a, b):
    """Both in their stored dtype where they share it, else both f32."""
    if a.dtype != b.dtype:
        return a.astype(jnp.float32), b.astype(jnp.float32)
    return a, b


def index_topk(q, kc, w, table, pos, k, scale):
    """q[B, S, H, D], kc[blocks, bs, 1, D], w[B, S, H], table[B, C], pos[B, S] -> i32 [B, S, k]."""
    b, s = pos.shape
    c = table.shape[1]
    bs, d = kc.shape[1], kc.shape[3]
    n_pos = c * bs
    keys = jnp.take(kc, table, axis=0, mode="clip").reshape(b, n_pos, d)  # [B, T, D]
    qq, keys = _operands(q, keys)
    dots = jnp.einsum("bshd,btd->bsht", qq, keys, precision=HIGHEST, preferred_element_type=jnp.float32)
    dots = jnp.maximum(dots * scale, 0.0)
    scores = jnp.einsum("bsh,bsht->bst", w.astype(jnp.float32), dots, precision=HIGHEST)  # [B, S, T]
    scores = jnp.where(scores == 0, 0.0, scores)  # -0 -> +0
    t = lax.broadcasted_iota(pos.dtype, (1, 1, n_pos), 2)
    scores = jnp.where(t <= pos[:, :, None], scores, -jnp.inf)  # NaN of a slot past p goes too
    m = min(k, n_pos)
    best, idx = lax.top_k(scores, m)
    idx = jnp.where(best > -jnp.inf, idx.astype(jnp.int32), -1)
    if m < k:
        idx = jnp.concatenate([idx, jnp.full((b, s, k - m), -1, dtype=jnp.int32)], axis=-1)
    return idx


def _softmax(scores, seen):
    # scores: [..., K] f32, seen: bool broadcastable to it (every row sees at least one)
    scores = jnp.where(seen, scores, -jnp.inf)
    top = scores.max(axis=-1, keepdims=True)
    p = jnp.exp(scores - top)
    return p / p.sum(axis=-1, keepdims=True)


def attend_slots(q, kc, vc, table, pos, sel, scale, shared):
    """Each query over the slots of its `sel` row: q[B, S, H, Dk] -> f32 [B, S, H, Dv]."""
    b, s, h, dk = q.shape
    _, bs, hkv, dv = vc.shape
    n_pos = table.shape[1] * bs
    sel = jnp.sort(sel, axis=-1)
    repeat = jnp.concatenate([jnp.zeros((b, s, 1), dtype=bool), sel[..., 1:] == sel[..., :-1]], axis=-1)
    seen = (sel >= 0) & (sel <= pos[:, :, None]) & (sel < n_pos) & ~repeat  # [B, S, K]
    t = jnp.clip(sel, 0, n_pos - 1)
    blocks = jnp.take_along_axis(table, (t // bs).reshape(b, -1), axis=1).reshape(t.shape)
    slots = blocks * bs + t % bs  # [B, S, K]: rows of the cache viewed as slots
    krows = jnp.take(kc.reshape(-1, hkv, dk), slots, axis=0, mode="clip")  # [B, S, K, Hkv, Dk]
    vrows = krows if shared else jnp.take(vc.reshape(-1, hkv, dv), slots, axis=0, mode="clip")
    vrows = jnp.where(seen[..., None, None], vrows.astype(jnp.float32), 0.0)
    qg, krows = _operands(q.reshape(b, s, hkv, h // hkv, dk), krows)
    scores = jnp.einsum(
        "bsgrd,bskgd->bsgrk", qg, krows, precision=HIGHEST, preferred_element_type=jnp.float32
    )
    p = _softmax(scores * scale, seen[:, :, None, None, :])  # [B, S, Hkv, rep, K]
    out = jnp.einsum("bsgrk,bskgd->bsgrd", p, vrows, precision=HIGHEST)
    return out.reshape(b, s, h, dv)


def attend_table(q, kc, vc, table, pos, sel, scale, shared):
    """Each query over the whole block table, masked to its `sel` row: -> f32 [B, S, H, Dv]."""
    b, s, h, dk = q.shape
    _, bs, hkv, dv = vc.shape
    n_pos = table.shape[1] * bs
    k = jnp.take(kc, table, axis=0, mode="clip").reshape(b, n_pos, hkv, dk)  # [B, T, Hkv, Dk]
    v = k if shared else jnp.take(vc, table, axis=0, mode="clip").reshape(b, n_pos, hkv, dv)
    inside = (sel >= 0) & (sel < n_pos)
    col = jnp.where(inside, sel, n_pos)  # column n_pos takes what is outside the table
    bi = lax.broadcasted_iota(jnp.int32, sel.shape, 0)
    si = lax.broadcasted_iota(jnp.int32, sel.shape, 1)
    chosen = jnp.zeros((b, s, n_pos + 1), dtype=bool).at[bi, si, col].set(True)[..., :n_pos]
    t = lax.broadcasted_iota(pos.dtype, (1, 1, n_pos), 2)
    visible = chosen & (t <= pos[:, :, None])  # [B, S, T]
    v = jnp.where(visible.any(axis=1)[:, :, None, None], v.astype(jnp.float32), 0.0)
    qg, k = _operands(q.reshape(b, s, hkv, h // hkv, dk), k)
    scores = jnp.einsum("bsgrd,btgd->bgrst", qg, k, precision=HIGHEST, preferred_element_type=jnp.float32)
    p = _softmax(scores * scale, visible[:, None, None])  # [B, Hkv, rep, S, T]
    out = jnp.einsum("bgrst,btgd->bsgrd", p, v, precision=HIGHEST)
    return out.reshape(b, s, h, dv)


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    scale = attrs["scale"]

    if node.op == "indexer_topk":
        k = attrs["k"]

        def launch_topk(*inputs):
            q, kc, w, table, pos = (inputs[i] for i in args)
            return (index_topk(q, kc, w, table, pos, k, scale),)

        return launch_topk

    out = dtypes.canonicalize_dtype(spec.types[node.outputs[0]].dtype.numpy)
    shared = args[1] == args[2]  # one latent cache for keys and values
    attend = {"slots": attend_slots, "table": attend_table}[config.get("read", "slots")]

    def launch(*inputs):
        q, kc, vc, table, pos, sel = (inputs[i] for i in args)
        return (attend(q, kc, vc, table, pos, sel, scale, shared).astype(out),)

    return launch
