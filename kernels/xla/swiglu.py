"""The SwiGLU MLP input in one function: silu(x @ w_gate^T) * (x @ w_up^T), gate and up kept in f32.

Two dots on one activation, not a concatenated weight: the weights are HLO parameters, and
concatenating them inside the step would copy both through HBM on every step."""

import jax.numpy as jnp
from jax import dtypes, lax

IMPLEMENTS = "linear+silu*mul"
CONFIGS = [{}]


def supports(spec):
    return all(len(n.inputs) == 2 for n in spec.nodes if n.op == "linear")  # no bias


def build(spec, config, target):
    linears = [n for n in spec.nodes if n.op == "linear"]
    mul, act = spec.node("mul"), spec.node("silu")
    gate = next(n for n in linears if n.outputs[0] == act.inputs[0])
    up = next(n for n in linears if n.outputs[0] in mul.inputs and n is not gate)
    x_i = spec.inputs.index(gate.inputs[0])
    wg_i, wu_i = spec.inputs.index(gate.inputs[1]), spec.inputs.index(up.inputs[1])
    out = dtypes.canonicalize_dtype(spec.types[mul.outputs[0]].dtype.numpy)

    def project(x, w):  # x: [*, D], w: [F, D] -> [*, F] f32
        if x.dtype != w.dtype:
            x, w = x.astype(jnp.float32), w.astype(jnp.float32)
        dims = (((x.ndim - 1,), (1,)), ((), ()))
        return lax.dot_general(
            x, w, dims, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32
        )

    def launch(*inputs):
        x = inputs[x_i]
        g, u = project(x, inputs[wg_i]), project(x, inputs[wu_i])
        return ((g / (1.0 + jnp.exp(-g)) * u).astype(out),)

    return launch
