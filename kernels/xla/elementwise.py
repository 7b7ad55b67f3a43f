"""Elementwise ops and small reductions: silu, gelu, scale, softcap, mul, add, softmax, argmax, cast
(f32 inside). scale's factor is a float32 constant, rounded to x's dtype first (float32 -> dtype, as
the reference and torch round it) under round_factor_to_dtype."""

import math

import jax.numpy as jnp
import numpy as np
from jax import dtypes, lax

IMPLEMENTS = ("silu", "gelu", "scale", "softcap", "mul", "add", "softmax", "argmax", "cast")
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    op = node.op
    out_type = spec.types[node.outputs[0]]
    out = dtypes.canonicalize_dtype(out_type.dtype.numpy)

    factor = cap = None
    if op == "scale":
        factor = np.float32(attrs["factor"])
        if attrs["round_factor_to_dtype"]:
            x_dtype = spec.types[node.inputs[0]].dtype.numpy
            factor = np.float32(np.asarray(factor, dtype=np.float32).astype(x_dtype))
    elif op == "softcap":
        cap = np.float32(attrs["cap"])

    def f32(x):
        return x.astype(jnp.float32)

    def launch(*inputs):
        xs = [inputs[i] for i in args]
        if op == "silu":
            x = f32(xs[0])
            y = x / (1.0 + jnp.exp(-x))
        elif op == "gelu":
            x = f32(xs[0])
            if attrs["approximate"] == "tanh":
                y = 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
            else:
                y = 0.5 * x * (1.0 + lax.erf(x / math.sqrt(2.0)))
        elif op == "scale":
            y = f32(xs[0]) * factor
        elif op == "softcap":
            y = cap * jnp.tanh(f32(xs[0]) / cap)
        elif op == "mul":
            y = f32(xs[0]) * f32(xs[1])
        elif op == "add":
            y = f32(xs[0]) + f32(xs[1])
        elif op == "softmax":
            x = f32(xs[0])
            e = jnp.exp(x - x.max(axis=attrs["axis"], keepdims=True))
            y = e / e.sum(axis=attrs["axis"], keepdims=True)
        elif op == "argmax":
            # On the f32 values, as the reference does (integers past 2^24 tie as it rounds them).
            y = jnp.argmax(f32(xs[0]), axis=attrs["axis"])
        else:  # cast: floats go through f32, so f16 -> fp8 rounds once, as the reference does
            x = xs[0]
            y = f32(x) if jnp.issubdtype(x.dtype, jnp.floating) else x
            if jnp.issubdtype(out, jnp.floating) and jnp.finfo(out).bits == 8:
                limit = float(jnp.finfo(out).max)  # fp8 saturates, as the reference defines
                y = jnp.where(jnp.isfinite(y), jnp.clip(y, -limit, limit), y)
        return (y.astype(out),)

    return launch
