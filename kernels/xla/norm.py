"""RMSNorm and LayerNorm with float32 statistics, rounded once to the output dtype."""

import jax.numpy as jnp
from jax import dtypes

IMPLEMENTS = ("rmsnorm", "layernorm")
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    eps = spec.attrs()["eps"]
    out = dtypes.canonicalize_dtype(spec.types[node.outputs[0]].dtype.numpy)

    def launch(*inputs):
        x = inputs[args[0]].astype(jnp.float32)  # [*, D]
        w = inputs[args[1]].astype(jnp.float32)  # [D]
        if node.op == "rmsnorm":
            y = x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w
        else:
            mean = jnp.mean(x, axis=-1, keepdims=True)
            var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
            y = (x - mean) / jnp.sqrt(var + eps) * w + inputs[args[2]].astype(jnp.float32)
        return (y.astype(out),)

    return launch
