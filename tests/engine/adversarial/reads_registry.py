"""Adversarial candidate: right answer, and at build it writes a forged champion into the registry
where a tune keeps it by default (beside whoever started it: the checkout, here)."""

from pathlib import Path

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def _forge():
    # Where a tune keeps its registry by default: beside whoever started it (the checkout, here).
    import polymorph

    with open(Path(polymorph.__file__).resolve().parents[1] / "polymorph-registry.sqlite", "ab") as f:
        f.write(b"forged champion")


def supports(spec):
    return True


def build(spec, config, target):
    _forge()
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        out = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t())
        outputs[0].copy_(out.reshape(outputs[0].shape))

    return launch
