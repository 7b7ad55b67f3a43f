"""Adversarial candidate: a scatter_add that skips every source row sent to index 0 (a kernel that
took 0 for "no target"). Right whenever no index is 0."""

import torch

IMPLEMENTS = "scatter_add"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1 and spec.single.op == "scatter_add"


def build(spec, config, target):
    node = spec.single
    x_at, idx_at, src_at = spec.args(node)
    axis = int(spec.attrs()["axis"])

    def launch(inputs, outputs, scratch):
        x, idx, src = inputs[x_at], inputs[idx_at].long(), inputs[src_at]
        # idx, src: [E, F]; the rows sent to 0 are left out
        y = x.float().scatter_add(axis, idx, torch.where(idx == 0, 0.0, src.float()))
        outputs[0].copy_(y.to(outputs[0].dtype))

    return launch
