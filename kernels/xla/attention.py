"""Grouped-query attention, causal over q/k/v and over the paged KV cache, in float32.

q·k^T keeps the stored operand dtype and accumulates in f32; the softmax and P·V are f32, as in
the reference. The paged cache is read by gathering each sequence's blocks through its block table
(an HLO gather) into a logical [B, T, Hkv, Dh] view; positions past a token's own are masked, and
under a sliding window those at or before p - window; a decode step (one query per sequence) under a
window gathers only the blocks its window covers (window / block_size + 1 of them), and under a chunk
(Llama 4's chunked attention: the query at p sees p // chunk * chunk <= k <= p) those its chunk covers.
Soft-capping (cap * tanh(s / cap)) applies to the scaled scores before the mask. Sinks (the optional
last input, [H]) join each row's softmax: its max includes the sink and its denominator adds
exp(sink - max); they carry no value. A slot no query sees may hold anything (NaN included): its V rows
are zeroed before P·V, since 0 * NaN is NaN."""

import jax.numpy as jnp
from jax import dtypes, lax

IMPLEMENTS = ("attention", "cache_attention")
CONFIGS = [{}]
HIGHEST = lax.Precision.HIGHEST


# the attrs this file implements (an attr added to the op later is refused until it is)
_ATTRS = {"scale", "causal", "window", "softcap", "chunk"}


def supports(spec):
    return len(spec.nodes) == 1 and set(spec.attrs()) <= _ATTRS


def attend(q, k, v, visible, scale, softcap=0.0, sinks=None):
    """q[B, S, H, Dh], k/v[B, T, Hkv, Dh], visible[B, S, T] (, sinks[H]) -> f32 [B, S, H, Dh]."""
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
    top = scores.max(axis=-1, keepdims=True)
    rest = 0.0  # the sink's share of the denominator
    if sinks is not None:
        sink = sinks.astype(jnp.float32).reshape(1, hkv, h // hkv, 1, 1)
        top = jnp.maximum(top, sink)
        rest = jnp.exp(sink - top)
    p = jnp.exp(scores - top)
    p = p / (p.sum(axis=-1, keepdims=True) + rest)
    v = jnp.where(visible.any(axis=1)[:, :, None, None], v.astype(jnp.float32), 0.0)
    out = jnp.einsum("bgrst,btgd->bsgrd", p, v, precision=HIGHEST)
    return out.reshape(b, s, h, d)


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    scale, window, softcap, chunk = attrs["scale"], attrs["window"], attrs["softcap"], attrs["chunk"]
    n_in = 5 if node.op == "cache_attention" else 3  # then the optional sinks[H]
    sink_arg = args[n_in] if len(args) > n_in else None
    out = dtypes.canonicalize_dtype(spec.types[node.outputs[0]].dtype.numpy)

    if node.op == "attention":

        def launch(*inputs):
            q, k, v = (inputs[i] for i in args[:3])
            sinks = None if sink_arg is None else inputs[sink_arg]
            s, t = q.shape[1], k.shape[1]
            visible = jnp.ones((q.shape[0], s, t), dtype=bool)
            if attrs["causal"]:
                visible = visible & jnp.tril(jnp.ones((s, t), dtype=bool))
            if window:  # causal: query i sees keys i - window < j <= i
                visible = visible & ~jnp.tril(jnp.ones((s, t), dtype=bool), -window)
            if chunk:  # causal: query i sees keys j <= i of its own chunk
                visible = visible & ((jnp.arange(s)[:, None] // chunk) == (jnp.arange(t)[None, :] // chunk))
            return (attend(q, k, v, visible, scale, softcap, sinks).astype(out),)

        return launch

    def launch_cache(*inputs):
        q, kc, vc, table, pos = (inputs[i] for i in args[:5])
        sinks = None if sink_arg is None else inputs[sink_arg]
        b, blocks = table.shape
        _, block_size, hkv, d = kc.shape
        first = jnp.zeros((b, 1), dtype=pos.dtype)  # absolute position of each row's first gathered key
        reach = window or chunk  # keys a decode token sees at most
        span = -(-reach // block_size) + 1  # blocks that hold them, at most
        if reach and q.shape[1] == 1 and span < blocks:
            # Decode under a window (chunk): gather only the `span` blocks from the one holding its first
            # key (moved back where the table ends), never a block wholly outside the window (chunk).
            if window:
                lo = jnp.maximum(pos[:, 0] - window + 1, 0) // block_size  # [B]
            else:
                lo = pos[:, 0] // chunk * chunk // block_size
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
        if chunk:
            visible = visible & (t[:, None, :] // chunk == pos[:, :, None] // chunk)
        return (attend(q, k, v, visible, scale, softcap, sinks).astype(out),)

    return launch_cache
