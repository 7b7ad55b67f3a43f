"""Rotary position embedding (rotate-half layout) of every rope type, on the first rotary_dim dims of
each head (the rest passed through), cos and sin times the attention factor.

The inverse frequencies are constants of rotary_dim / 2 floats (256 bytes at 128 dims), under the
compile checker's limit; the angles are computed from the positions on the device. "longrope" carries
both tables and picks one on the device from the call's max(positions) + 1; "dynamic" grows its base
on the device: with L = max(max(positions) + 1, max_position_embeddings) and s = factor * L /
max_position_embeddings - (factor - 1), its frequencies are the unscaled ones times s^(-2i / (dim - 2))
(transformers' base * s^(dim / (dim - 2)) raised to -2i / dim), in float32 as transformers computes."""

import jax.numpy as jnp
import numpy as np
from jax import dtypes

from polymorph.ir.ops import rope_rotary_dim
from polymorph.ir.reference import rope_inv_freq

IMPLEMENTS = "rope"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def _inv_freq(attrs, head_dim, dim):
    """inv_freq(positions) -> [dim / 2] f32 for the call."""
    kind = attrs["rope_type"]
    static = np.asarray(rope_inv_freq(head_dim, attrs), dtype=np.float32)  # [dim / 2]
    if kind == "longrope":
        old = attrs["original_max_position_embeddings"]
        long = np.asarray(rope_inv_freq(head_dim, attrs, seq_len=old + 1), dtype=np.float32)
        return lambda pos: jnp.where(jnp.max(pos) + 1 > old, long, static)
    if kind == "dynamic":
        factor, max_pos = attrs["factor"], attrs["max_position_embeddings"]
        power = -np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim - 2)  # [dim / 2]

        def dynamic(pos):
            length = jnp.maximum(jnp.max(pos) + 1, max_pos).astype(jnp.float32)
            s = factor * length / max_pos - (factor - 1)
            return static * jnp.power(s, power)

        return dynamic
    return lambda pos: static


def build(spec, config, target):
    node = spec.single
    x_i, pos_i = spec.args(node)
    attrs = spec.attrs()
    head_dim = spec.types[node.inputs[0]].shape[-1]
    dim = rope_rotary_dim(attrs, head_dim)
    half = dim // 2
    factor = np.float32(attrs["attention_factor"])
    inv_freq = _inv_freq(attrs, head_dim, dim)
    out = dtypes.canonicalize_dtype(spec.types[node.outputs[0]].dtype.numpy)

    def launch(*inputs):
        x = inputs[x_i].astype(jnp.float32)  # [B, S, H, Dh]
        pos = inputs[pos_i]
        if pos.size == 0:
            return (x.astype(out),)
        angles = pos.astype(jnp.float32)[..., None] * inv_freq(pos)  # [B, S, dim / 2]
        cos = jnp.cos(angles)[:, :, None, :] * factor  # [B, S, 1, dim / 2]
        sin = jnp.sin(angles)[:, :, None, :] * factor
        x1, x2, rest = x[..., :half], x[..., half:dim], x[..., dim:]
        y = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)
        return (y.astype(out),)

    return launch
