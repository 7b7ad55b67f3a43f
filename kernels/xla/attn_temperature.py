"""Llama 4's attention temperature on its layers without rope: x * (log1p(floor((p + 1) / floor_scale))
* scale + 1) per token, in f32, as transformers computes it."""

import jax.numpy as jnp
import numpy as np
from jax import dtypes

IMPLEMENTS = "attn_temperature"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    node = spec.single
    x_i, pos_i = spec.args(node)
    attrs = spec.attrs()
    floor_scale, scale = np.float32(attrs["floor_scale"]), np.float32(attrs["scale"])
    out = dtypes.canonicalize_dtype(spec.types[node.outputs[0]].dtype.numpy)

    def launch(*inputs):
        p = inputs[pos_i].astype(jnp.float32)  # [B, S]
        factor = jnp.log1p(jnp.floor((p + 1.0) / floor_scale)) * scale + 1.0
        return ((inputs[x_i].astype(jnp.float32) * factor[:, :, None, None]).astype(out),)

    return launch
