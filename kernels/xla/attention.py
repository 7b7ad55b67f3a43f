"""Grouped-query attention, causal over q/k/v and over the paged KV cache, in float32.

q·k^T keeps the stored operand dtype and accumulates in f32; the softmax and P·V are f32, as in
the reference. The paged cache is read by gathering each sequence's blocks through its block table
(an HLO gather) into a logical [B, T, Hkv, Dh] view; positions past a token's own are masked, and
under a sliding window those at or before p - window; a decode step (one query per sequence) under a
window gathers only the blocks its window covers (window / block_size + 1 of them). Soft-capping (cap * tanh(s / cap)) applies to the
scaled scores before the mask. A slot no query sees may hold anything (NaN included): its V rows are
zeroed before P·V, since 0 * NaN is NaN."""

import jax.numpy as jnp
from jax import dtypes, lax

IMPLEMENTS = ("attention", "cache_attention")
CONFIGS = [{}]
HIGHEST = lax.Precision.HIGHEST


def supports(spec):
    return len(spec.nodes) == 1


def attend(q, k, v, visible, scale, softcap=0.0):
    """q[B, S, H, Dh], k/v[B, T, Hkv, Dh], visible[B, S, T] -> f32 [B, S, H, Dh]."""
    b, s, h, d = q.shape
    hkv = k.shape[2]
    qg = q.reshape(b, s, hkv, h // hkv, d)  # query heads grouped by the kv head they share
    if qg.dtype != k.dtype:
        qg, k = qg.astype(jnp.float32), k.astype(jnp.float32)
    scores = jnp.einsum("bsgrd,btgd->bgrst", qg, k, precision=HIGHEST, preferred_element_type=jnp.float32)
    scores = scores * scale
    if softcap:
        scores = softcap * jnp.tanh(scores / softcap)
    scores = jnp.where(visible[:, None, None], scores, -jnp.inf)  # [B, Hkv, rep, S, T]
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = jnp.exp(scores)
    p = p / p.sum(axis=-1, keepdims=True)
    v = jnp.where(visible.any(axis=1)[:, :, None, None], v.astype(jnp.float32), 0.0)
    out = jnp.einsum("bgrst,btgd->bsgrd", p, v, precision=HIGHEST)
    return out.reshape(b, s, h, d)


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    scale, window, softcap = attrs["scale"], attrs["window"], attrs["softcap"]
    out = dtypes.canonicalize_dtype(spec.types[node.outputs[0]].dtype.numpy)

    if node.op == "attention":

        def launch(*inputs):
            q, k, v = (inputs[i] for i in args)
            s, t = q.shape[1], k.shape[1]
            visible = jnp.ones((q.shape[0], s, t), dtype=bool)
            if attrs["causal"]:
                visible = visible & jnp.tril(jnp.ones((s, t), dtype=bool))
            if window:  # causal: query i sees keys i - window < j <= i
                visible = visible & ~jnp.tril(jnp.ones((s, t), dtype=bool), -window)
            return (attend(q, k, v, visible, scale, softcap).astype(out),)

        return launch

    def launch_cache(*inputs):
        q, kc, vc, table, pos = (inputs[i] for i in args)
        b, blocks = table.shape
        _, block_size, hkv, d = kc.shape
        first = jnp.zeros((b, 1), dtype=pos.dtype)  # absolute position of each row's first gathered key
        span = -(-window // block_size) + 1  # blocks that hold a decode token's window, at most
        if window and q.shape[1] == 1 and span < blocks:
            # Decode under a window: gather only the `span` blocks from the one holding the window's
            # first key (moved back where the table ends), never a block wholly outside the window.
            lo = jnp.maximum(pos[:, 0] - window + 1, 0) // block_size  # [B]
            lo = jnp.minimum(lo, blocks - span)
            table = jnp.take_along_axis(table, lo[:, None] + jnp.arange(span, dtype=lo.dtype)[None], axis=1)
            first = (lo * block_size)[:, None]
            blocks = span
        k = jnp.take(kc, table, axis=0, mode="clip").reshape(
            b, blocks * block_size, hkv, d
        )  # [B, T, Hkv, Dh]
        v = jnp.take(vc, table, axis=0, mode="clip").reshape(b, blocks * block_size, hkv, d)
        t = first + jnp.arange(blocks * block_size, dtype=pos.dtype)[None]  # [B, T]
        visible = t[:, None, :] <= pos[:, :, None]  # [B, S, T]
        if window:
            visible = visible & (t[:, None, :] > pos[:, :, None] - window)
        return (attend(q, k, v, visible, scale, softcap).astype(out),)

    return launch_cache
