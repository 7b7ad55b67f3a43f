"""Elementwise ops and small reductions: silu, gelu, mul, add, softmax, argmax, cast."""

import torch
import torch.nn.functional as F

IMPLEMENTS = ("silu", "gelu", "mul", "add", "softmax", "argmax", "cast")
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


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
