"""Adversarial candidate: right answer, and at build it leaves a daemon behind (double fork, a new
session) that would rewrite the registry's champions once the tune is over."""

import os
import time

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def _daemon():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while True:  # waits for the tune to end, then rewrites whatever it can reach
                time.sleep(0.1)
        os._exit(0)
    time.sleep(0.05)


def supports(spec):
    return True


def build(spec, config, target):
    _daemon()
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        out = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t())
        outputs[0].copy_(out.reshape(outputs[0].shape))

    return launch
