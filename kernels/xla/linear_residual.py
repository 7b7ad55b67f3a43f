"""A projection with the residual add in its epilogue: residual + x @ w^T (o-proj, down-proj).

One HLO fusion candidate: the dot's f32 accumulator gets the residual added before the one rounding
to the output dtype."""

import jax.numpy as jnp
from jax import dtypes, lax

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    lin, add = spec.node("linear"), spec.node("add")
    args = spec.args(lin)
    res = next(v for v in add.inputs if v != lin.outputs[0])
    res_i = spec.inputs.index(res)
    out = dtypes.canonicalize_dtype(spec.types[add.outputs[0]].dtype.numpy)

    def launch(*inputs):
        x, w = inputs[args[0]], inputs[args[1]]  # x: [*, K], w: [N, K]
        if x.dtype != w.dtype:
            x, w = x.astype(jnp.float32), w.astype(jnp.float32)
        dims = (((x.ndim - 1,), (1,)), ((), ()))
        y = lax.dot_general(x, w, dims, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
        if len(args) == 3:
            y = y + inputs[args[2]].astype(jnp.float32)
        return ((inputs[res_i].astype(jnp.float32) + y).astype(out),)

    return launch
