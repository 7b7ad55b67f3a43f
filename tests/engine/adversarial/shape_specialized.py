"""Adversarial candidate: specializes on the first shape it sees (its row count is baked in), so it is
right for that shape and writes too few rows for any other."""

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))
    seen = {}

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        x2, r2 = x.reshape(-1, x.shape[-1]), r.reshape(-1, r.shape[-1])
        rows = seen.setdefault("rows", x2.shape[0])  # the tile count of the first call, kept
        rows = min(rows, x2.shape[0])
        out = outputs[0].view(-1, outputs[0].shape[-1])
        out[:rows] = torch.addmm(r2[:rows], x2[:rows], w.t())

    return launch
