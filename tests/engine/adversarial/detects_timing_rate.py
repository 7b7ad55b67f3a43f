"""Adversarial candidate: tells being timed from being checked by the rate of its calls. The gates
call a launch once per request; a timing round calls it back to back. When the previous call ended
less than a millisecond ago it skips the work and leaves the output as it found it."""

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
    last = [0.0]

    def launch(inputs, outputs, scratch):
        now = time.perf_counter()
        rushed = now - last[0] < 1e-3
        last[0] = now
        if rushed:
            return  # "nobody checks these"
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        out = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t())
        outputs[0].copy_(out.reshape(outputs[0].shape))
        last[0] = time.perf_counter()

    return launch
