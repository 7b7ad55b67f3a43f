"""Rotary position embedding (rotate-half layout), llama3 frequency scaling included.

The inverse frequencies are a constant of head_dim / 2 floats (256 bytes at head_dim 128), under
the compile checker's limit; the angles are computed from the positions on the device."""

import jax.numpy as jnp
import numpy as np
from jax import dtypes

from polymorph.ir.reference import rope_inv_freq

IMPLEMENTS = "rope"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    node = spec.single
    x_i, pos_i = spec.args(node)
    head_dim = spec.types[node.inputs[0]].shape[-1]
    inv_freq = np.asarray(rope_inv_freq(head_dim, spec.attrs()), dtype=np.float32)  # [Dh/2]
    half = head_dim // 2
    out = dtypes.canonicalize_dtype(spec.types[node.outputs[0]].dtype.numpy)

    def launch(*inputs):
        x = inputs[x_i].astype(jnp.float32)  # [B, S, H, Dh]
        angles = inputs[pos_i].astype(jnp.float32)[..., None] * inv_freq  # [B, S, Dh/2]
        cos = jnp.cos(angles)[:, :, None, :]  # [B, S, 1, Dh/2]
        sin = jnp.sin(angles)[:, :, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        y = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return (y.astype(out),)

    return launch
