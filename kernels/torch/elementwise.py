"""Elementwise ops and small reductions: silu, gelu, scale, softcap, mul, add, softmax, argmax, cast.

scale's factor is a float32 constant, rounded to x's dtype first under round_factor_to_dtype (from
Python's double straight to that dtype, as torch.tensor(factor, dtype=...) rounds it)."""

import torch
import torch.nn.functional as F

IMPLEMENTS = ("silu", "gelu", "scale", "softcap", "mul", "add", "softmax", "argmax", "cast")
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def scale_factor(attrs, dtype):
    """scale's multiplier as a float32 tensor: the factor, rounded to `dtype` first if asked."""
    factor = torch.tensor(attrs["factor"], dtype=torch.float32)
    if attrs["round_factor_to_dtype"]:
        factor = torch.tensor(attrs["factor"], dtype=dtype).float()
    return factor


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    op = node.op

    def launch(inputs, outputs, scratch):
        xs = [inputs[i] for i in args]
        out = outputs[0]
        if op == "silu":
            out.copy_(F.silu(xs[0].float()))
        elif op == "gelu":
            out.copy_(F.gelu(xs[0].float(), approximate=attrs["approximate"]))
        elif op == "scale":
            out.copy_(xs[0].float() * scale_factor(attrs, xs[0].dtype))
        elif op == "softcap":
            out.copy_(torch.tanh(xs[0].float() / attrs["cap"]) * attrs["cap"])
        elif op == "mul":
            out.copy_(xs[0].float() * xs[1].float())
        elif op == "add":
            out.copy_(xs[0].float() + xs[1].float())
        elif op == "softmax":
            out.copy_(torch.softmax(xs[0].float(), dim=attrs["axis"]))
        elif op == "argmax":
            out.copy_(torch.argmax(xs[0].float(), dim=attrs["axis"]))
        else:  # cast
            out.copy_(xs[0].float() if xs[0].is_floating_point() else xs[0])

    return launch
