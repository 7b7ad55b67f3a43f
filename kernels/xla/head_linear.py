"""A projection per head: x[*, H, K], w[H, N, K] -> [*, H, N] (MLA's absorbed up-projections), in f32."""

import jax.numpy as jnp
from jax import dtypes

IMPLEMENTS = "head_linear"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    node = spec.single
    x_i, w_i = spec.args(node)
    out = dtypes.canonicalize_dtype(spec.types[node.outputs[0]].dtype.numpy)

    def launch(*inputs):
        x, w = inputs[x_i].astype(jnp.float32), inputs[w_i].astype(jnp.float32)
        return (jnp.einsum("...hk,hnk->...hn", x, w).astype(out),)

    return launch
