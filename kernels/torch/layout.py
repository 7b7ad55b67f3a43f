"""Layout ops: reshape, transpose, slice, concat (copies into the preallocated output)."""

import torch

IMPLEMENTS = ("reshape", "transpose", "slice", "concat")
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    op = node.op

    def launch(inputs, outputs, scratch):
        out = outputs[0]
        x = inputs[args[0]]
        if op == "reshape":
            out.copy_(x.reshape(out.shape))
        elif op == "transpose":
            out.copy_(x.permute(*attrs["perm"]))
        elif op == "slice":
            axis = attrs["axis"] % x.dim()
            index = [slice(None)] * x.dim()
            index[axis] = slice(attrs["start"], attrs["end"])
            out.copy_(x[tuple(index)])
        else:
            torch.cat([inputs[i] for i in args], dim=attrs["axis"], out=out)

    return launch
