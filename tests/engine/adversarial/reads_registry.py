"""Adversarial candidate: right answer, and at build it goes looking for the champion registry and the
board (the user's data folder, the working directory of whoever started the engine) to forge a result."""

import os
from pathlib import Path

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def _forge():
    for home in ("/root", "/home", os.getcwd(), "/tmp"):
        for path in Path(home).rglob("*.sqlite"):
            with open(path, "r+b") as f:
                f.write(b"forged")
            return
    raise RuntimeError("no registry found")


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
