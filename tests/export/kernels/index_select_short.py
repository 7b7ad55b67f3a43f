"""Adversarial candidate: an index_select whose bound check is one row short. Indices are clamped to
n - 2 for a dim of n, so it is right on every index but the last row's, which it reads as the row
before: a gate that never draws index n - 1 passes it."""

import torch

IMPLEMENTS = "index_select"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1 and spec.single.op == "index_select"


def build(spec, config, target):
    node = spec.single
    x_at, idx_at = spec.args(node)
    axis = int(spec.attrs()["axis"])

    def launch(inputs, outputs, scratch):
        x, idx = inputs[x_at], inputs[idx_at]
        # idx: [E]; x: [..., n, ...] along axis
        y = torch.index_select(x, axis, idx.long().clamp(max=x.shape[axis] - 2))
        outputs[0].copy_(y.to(outputs[0].dtype))

    return launch
