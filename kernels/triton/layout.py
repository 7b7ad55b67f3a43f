"""Layout ops: reshape, transpose, slice, concat, as torch library calls on the device tensors (a copy
into the preallocated output: out.copy_(view) or torch.cat(out=)). No Triton kernel of this file's
own, so no compile_units: the plan's report lists these groups as library calls (torch).

Constraints (supports): cuda or rocm; any dtype torch copies. The calls allocate nothing and are
graph-capturable (cudaMemcpy-style copy kernels).
"""

from __future__ import annotations

from typing import Any

import torch

IMPLEMENTS = ("reshape", "transpose", "slice", "concat")
CONFIGS = [{}]


def supports(spec: Any) -> bool:
    return spec.target.is_gpu and len(spec.nodes) == 1 and spec.single.op in IMPLEMENTS


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    op = node.op

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
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
