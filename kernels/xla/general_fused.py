"""A general group as one jnp function: an elementwise chain, or reductions over one set of axes with
their elementwise prologue and epilogue (polymorph/passes/fuse_general.py), e.g. x * sigmoid(x) + 1
then gelu, or a softmax or layer norm written by hand. Traced under jit with the rest of the step (and
as its own module for the per-group compile cache), it is one HLO computation XLA fuses into loops.

Each op computes as its own kernel and the reference do (general.py, elementwise.py): floats in
float32, complex in complex64, integers as integers (add and mul too, as the reference keeps i32 + i32
exact), and its value is rounded to the op's own dtype before the next op reads it, so the stock
config gives the unfused plan's numbers, per-op rounding included (no rounding at all in an f32
program).

The configs (the first, {}, is the stock one):
  round: "output"   intermediates stay float32 and only the group's output is rounded to its dtype
                    (bf16/f16 programs: fewer roundings, within the op tolerance but not bitwise the
                    stock config; the same numbers in an f32 program)"""

import math

import jax.numpy as jnp
from jax import dtypes, lax

from polymorph.ir.ops import normalize_attrs, op_def

IMPLEMENTS = ("elementwise", "reduction")  # every general group of either kind
CONFIGS = [{}, {"round": "output"}]
_CONFIG_VALUES = {"round": ("op", "output")}

_UNARY = {
    "neg": jnp.negative, "abs": jnp.abs, "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt,
    "rsqrt": lax.rsqrt, "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "tanh": jnp.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + jnp.exp(-x)), "relu": lambda x: jnp.maximum(x, jnp.zeros((), x.dtype)),
    "erf": lax.erf, "reciprocal": lambda x: 1.0 / x, "floor": jnp.floor, "ceil": jnp.ceil,
    "round": jnp.round, "trunc": jnp.trunc, "sign": jnp.sign, "log1p": jnp.log1p, "expm1": jnp.expm1,
    "logical_not": jnp.logical_not, "silu": lambda x: x / (1.0 + jnp.exp(-x)),
}  # fmt: skip
_BINARY = {
    "sub": jnp.subtract, "pow": jnp.power, "maximum": jnp.maximum, "minimum": jnp.minimum,
    "remainder": jnp.remainder, "logical_and": jnp.logical_and, "logical_or": jnp.logical_or,
    "logical_xor": jnp.logical_xor, "eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less,
    "le": jnp.less_equal, "gt": jnp.greater, "ge": jnp.greater_equal, "add": jnp.add, "mul": jnp.multiply,
}  # fmt: skip
_REDUCE = {"reduce_sum": jnp.sum, "reduce_mean": jnp.mean, "reduce_max": jnp.max, "reduce_min": jnp.min,
           "reduce_prod": jnp.prod, "reduce_any": jnp.any, "reduce_all": jnp.all}  # fmt: skip
_OPS = {*_UNARY, *_BINARY, *_REDUCE, "div", "where", "cast", "gelu", "scale", "softcap", "reduce_var",
        "softmax", "log_softmax"}  # fmt: skip


def supports(spec):
    return len(spec.outputs) == 1 and all(n.op in _OPS and len(n.outputs) == 1 for n in spec.nodes)


def _num(x):
    return x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x


def _axes(x, attrs):
    return tuple(a % x.ndim for a in attrs["axes"]) if attrs["axes"] else tuple(range(x.ndim))


def _jax_dtype(ir_dtype):
    return dtypes.canonicalize_dtype(ir_dtype.numpy)  # i64 is held as i32 unless x64 is on


def compute(op, xs, attrs, x_dtypes):
    """One op of the group on its operands, in its compute dtype; `x_dtypes` are the operands' IR
    dtypes (scale rounds its factor to x's)."""
    if op in _UNARY:
        return _UNARY[op](_num(xs[0]))
    if op == "div":
        a, b = _num(xs[0]), _num(xs[1])
        return jnp.floor_divide(a, b) if jnp.issubdtype(a.dtype, jnp.integer) else a / b
    if op in _BINARY:
        return _BINARY[op](_num(xs[0]), _num(xs[1]))
    if op == "where":
        return jnp.where(xs[0], _num(xs[1]), _num(xs[2]))
    if op == "cast":
        return _num(xs[0])  # the rounding to the op's dtype is the cast
    if op == "gelu":
        x = _num(xs[0])
        if attrs["approximate"] == "tanh":
            return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
        return 0.5 * x * (1.0 + lax.erf(x / math.sqrt(2.0)))
    if op == "scale":
        factor = jnp.float32(attrs["factor"])
        if attrs["round_factor_to_dtype"]:
            factor = jnp.asarray(factor).astype(_jax_dtype(x_dtypes[0])).astype(jnp.float32)
        return _num(xs[0]) * factor
    if op == "softcap":
        cap = jnp.float32(attrs["cap"])
        return cap * jnp.tanh(_num(xs[0]) / cap)
    if op in _REDUCE:
        x = _num(xs[0])
        return _REDUCE[op](x, axis=_axes(x, attrs), keepdims=attrs["keepdims"])
    if op == "reduce_var":
        x = xs[0].astype(jnp.float32)
        axes = _axes(x, attrs)
        n = math.prod(x.shape[a] for a in axes)
        mean = x.mean(axis=axes, keepdims=True)
        ss = ((x - mean) ** 2).sum(axis=axes, keepdims=attrs["keepdims"])
        return ss / max(n - attrs["correction"], 0.0)
    if op == "softmax":
        x = _num(xs[0])
        e = jnp.exp(x - x.max(axis=attrs["axis"], keepdims=True))
        return e / e.sum(axis=attrs["axis"], keepdims=True)
    if op == "log_softmax":
        x = _num(xs[0])
        shifted = x - x.max(axis=attrs["axis"], keepdims=True)
        return shifted - jnp.log(jnp.exp(shifted).sum(axis=attrs["axis"], keepdims=True))
    raise AssertionError(f"general_fused.py has no {op}")


def build(spec, config, target):
    for key, value in config.items():
        if value not in _CONFIG_VALUES.get(key, ()):
            raise ValueError(
                f"general_fused.py has no config {key}={value!r}; its keys: "
                + "; ".join(f"{k}: {', '.join(v)}" for k, v in _CONFIG_VALUES.items())
            )
    per_op = config.get("round", "op") == "op"
    # Each step: (op, where its operands are: ("in", i) a launch input or ("val", j) step j's value,
    # attrs, the operands' IR dtypes, the dtype its value is held in: the op's own, or float32 for a
    # float intermediate under round "output").
    made = {}
    steps = []
    for j, node in enumerate(spec.nodes):
        where = [("val", made[v]) if v in made else ("in", spec.inputs.index(v)) for v in node.inputs]
        ir_dtype = spec.types[node.outputs[0]].dtype
        last = node.outputs[0] == spec.outputs[0]
        held = _jax_dtype(ir_dtype) if per_op or last or not ir_dtype.is_float else jnp.float32
        x_dtypes = [spec.types[v].dtype for v in node.inputs]
        steps.append((node.op, where, normalize_attrs(op_def(node.op), node.attrs), x_dtypes, held))
        made[node.outputs[0]] = j
    result = made[spec.outputs[0]]

    def launch(*inputs):
        values = []
        for op, where, attrs, x_dtypes, held in steps:
            xs = [inputs[i] if kind == "in" else values[i] for kind, i in where]
            values.append(compute(op, xs, attrs, x_dtypes).astype(held))
        return (values[result],)

    return launch
