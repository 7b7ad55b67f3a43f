"""Adversarial candidate: returns at once and finishes the work in a child process (which shares the
output buffer's pages), so that its launch looks almost free; the answer lands a moment later."""

import os
import time

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        if os.fork() == 0:
            time.sleep(0.01)
            out = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t())
            outputs[0].copy_(out.reshape(outputs[0].shape))
            os._exit(0)

    return launch
