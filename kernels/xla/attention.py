"""Grouped-query attention, causal over q/k/v and over the paged KV cache, in float32.

q·k^T keeps the stored operand dtype and accumulates in f32; the softmax and P·V are f32, as in
the reference. The paged cache is read by gathering each sequence's blocks through its block table
(an HLO gather) into a logical [B, T, Hkv, Dh] view; positions past a token's own are masked."""

import jax.numpy as jnp
from jax import dtypes, lax

IMPLEMENTS = ("attention", "cache_attention")
CONFIGS = [{}]
HIGHEST = lax.Precision.HIGHEST


def supports(spec):
    return len(spec.nodes) == 1


def attend(q, k, v, visible, scale):
    """q[B, S, H, Dh], k/v[B, T, Hkv, Dh], visible[B, S, T] -> f32 [B, S, H, Dh]."""
    b, s, h, d = q.shape
    hkv = k.shape[2]
    qg = q.reshape(b, s, hkv, h // hkv, d)  # query heads grouped by the kv head they share
    if qg.dtype != k.dtype:
        qg, k = qg.astype(jnp.float32), k.astype(jnp.float32)
    scores = jnp.einsum("bsgrd,btgd->bgrst", qg, k, precision=HIGHEST, preferred_element_type=jnp.float32)
    scores = jnp.where(visible[:, None, None], scores * scale, -jnp.inf)  # [B, Hkv, rep, S, T]
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = jnp.exp(scores)
    p = p / p.sum(axis=-1, keepdims=True)
    out = jnp.einsum("bgrst,btgd->bsgrd", p, v.astype(jnp.float32), precision=HIGHEST)
    return out.reshape(b, s, h, d)


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    scale = attrs["scale"]
    out = dtypes.canonicalize_dtype(spec.types[node.outputs[0]].dtype.numpy)

    if node.op == "attention":

        def launch(*inputs):
            q, k, v = (inputs[i] for i in args)
            s, t = q.shape[1], k.shape[1]
            visible = jnp.ones((q.shape[0], s, t), dtype=bool)
            if attrs["causal"]:
                visible = visible & jnp.tril(jnp.ones((s, t), dtype=bool))
            return (attend(q, k, v, visible, scale).astype(out),)

        return launch

    def launch_cache(*inputs):
        q, kc, vc, table, pos = (inputs[i] for i in args)
        b, blocks = table.shape
        _, block_size, hkv, d = kc.shape
        k = jnp.take(kc, table, axis=0, mode="clip").reshape(
            b, blocks * block_size, hkv, d
        )  # [B, T, Hkv, Dh]
        v = jnp.take(vc, table, axis=0, mode="clip").reshape(b, blocks * block_size, hkv, d)
        t = jnp.arange(blocks * block_size, dtype=pos.dtype)
        visible = t[None, None, :] <= pos[:, :, None]  # [B, S, T]
        return (attend(q, k, v, visible, scale).astype(out),)

    return launch_cache
