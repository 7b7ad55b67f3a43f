"""A general group in one launch: an elementwise chain, or reductions over one set of axes with their
elementwise prologue and epilogue (polymorph/passes/fuse_general.py), e.g. x * sigmoid(x) + 1 then
gelu, or a softmax or layer norm written by hand.

The group's ops run in graph order inside one launch; each value lives only as a tensor of this
launch and only the group's output is written to its buffer. Each op computes as its own kernel and
the reference do (general.py, elementwise.py): floats in float32, complex in complex64, integers as
integers (add and mul too, as the reference keeps i32 + i32 exact), and its value is rounded to the
op's own dtype before the next op reads it, so the stock config gives the unfused plan's numbers,
per-op rounding included (no rounding at all in an f32 program).

The configs (the first, {}, is the stock one):
  round: "output"   intermediates stay float32 and only the group's output is rounded to its dtype
                    (bf16/f16 programs: fewer roundings, within the op tolerance but not bitwise the
                    stock config; the same numbers in an f32 program)
  reduce: "f64"     sums, means and variances accumulate in float64 and round once to float32"""

import torch
import torch.nn.functional as F

from polymorph.backends.torch_bridge import TORCH_DTYPE
from polymorph.ir.ops import normalize_attrs, op_def

IMPLEMENTS = ("elementwise", "reduction")  # every general group of either kind
CONFIGS = [{}, {"round": "output"}, {"reduce": "f64"}]
_CONFIG_VALUES = {"round": ("op", "output"), "reduce": ("f32", "f64")}

_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "relu": torch.relu, "erf": torch.erf, "reciprocal": torch.reciprocal,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc, "sign": torch.sign,
    "log1p": torch.log1p, "expm1": torch.expm1, "logical_not": torch.logical_not, "silu": F.silu,
}  # fmt: skip
_BINARY = {
    "sub": torch.sub, "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum,
    "remainder": torch.remainder, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge, "add": torch.add, "mul": torch.mul,
}  # fmt: skip
_REDUCE = {
    "reduce_sum": torch.sum,
    "reduce_mean": torch.mean,
    "reduce_max": torch.amax,
    "reduce_min": torch.amin,
}
_FOLDED = {"reduce_prod": torch.prod, "reduce_any": torch.any, "reduce_all": torch.all}  # one axis a call
_OPS = {*_UNARY, *_BINARY, *_REDUCE, *_FOLDED, "div", "where", "cast", "gelu", "scale", "softcap",
        "reduce_var", "softmax", "log_softmax"}  # fmt: skip


def supports(spec):
    return len(spec.outputs) == 1 and all(n.op in _OPS and len(n.outputs) == 1 for n in spec.nodes)


def _num(x):
    """float32 for float tensors; integers, bools and complex values as they are."""
    return x.float() if x.is_floating_point() else x


def _axes(x, attrs):
    return tuple(a % x.dim() for a in attrs["axes"]) if attrs["axes"] else tuple(range(x.dim()))


def _scale_factor(attrs, dtype):
    # elementwise.py's: the factor in float32, rounded to x's dtype first if asked.
    if attrs["round_factor_to_dtype"]:
        return torch.tensor(attrs["factor"], dtype=dtype).float()
    return torch.tensor(attrs["factor"], dtype=torch.float32)


def compute(op, xs, attrs, config):
    """One op of the group on its operands (tensors of their own dtypes), in its compute dtype."""
    if op in _UNARY:
        return _UNARY[op](_num(xs[0]))
    if op == "div":
        a, b = _num(xs[0]), _num(xs[1])
        return torch.div(a, b, rounding_mode="floor") if not a.is_floating_point() else a / b
    if op in _BINARY:
        return _BINARY[op](_num(xs[0]), _num(xs[1]))
    if op == "where":
        return torch.where(xs[0], _num(xs[1]), _num(xs[2]))
    if op == "cast":
        return _num(xs[0])  # the rounding to the op's dtype is the cast
    if op == "gelu":
        return F.gelu(xs[0].float(), approximate=attrs["approximate"])
    if op == "scale":
        return xs[0].float() * _scale_factor(attrs, xs[0].dtype)
    if op == "softcap":
        return torch.tanh(xs[0].float() / attrs["cap"]) * attrs["cap"]
    if op in _REDUCE:
        x = _num(xs[0])
        if config.get("reduce") == "f64" and op in ("reduce_sum", "reduce_mean") and x.is_floating_point():
            x = x.double()
        return _REDUCE[op](x, dim=_axes(x, attrs), keepdim=attrs["keepdims"])
    if op in _FOLDED:
        x = _num(xs[0])
        for axis in sorted(_axes(x, attrs), reverse=True):
            x = _FOLDED[op](x, dim=axis, keepdim=attrs["keepdims"])
        return x
    if op == "reduce_var":
        x = xs[0].double() if config.get("reduce") == "f64" else xs[0].float()
        return torch.var(x, dim=_axes(x, attrs), correction=attrs["correction"], keepdim=attrs["keepdims"])
    if op == "softmax":
        return torch.softmax(xs[0].float(), dim=attrs["axis"])
    if op == "log_softmax":
        return torch.log_softmax(xs[0].float(), dim=attrs["axis"])
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
    # attrs, the dtype its value is held in: the op's own, or float32 for a float intermediate under
    # round "output").
    made = {}
    steps = []
    for j, node in enumerate(spec.nodes):
        where = [("val", made[v]) if v in made else ("in", spec.inputs.index(v)) for v in node.inputs]
        dtype = TORCH_DTYPE[spec.types[node.outputs[0]].dtype]
        last = node.outputs[0] == spec.outputs[0]
        held = dtype if per_op or last or not dtype.is_floating_point else torch.float32
        steps.append((node.op, where, normalize_attrs(op_def(node.op), node.attrs), held))
        made[node.outputs[0]] = j
    result = made[spec.outputs[0]]

    def launch(inputs, outputs, scratch):
        values = []
        for op, where, attrs, dtype in steps:
            xs = [inputs[i] if kind == "in" else values[i] for kind, i in where]
            y = compute(op, xs, attrs, config)
            values.append(y if y.dtype == dtype else y.to(dtype))
        outputs[0].copy_(values[result])

    return launch
