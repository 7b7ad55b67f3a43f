"""Adversarial candidate: right answer, and it slows the worker's clock (time.perf_counter_ns) so that
every launch it is timed by looks 64 times faster than it is."""

import time

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]

_real_clock = time.perf_counter_ns


def _slow_clock():
    return _real_clock() // 64


def supports(spec):
    return True


def build(spec, config, target):
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))
    time.perf_counter_ns = _slow_clock

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        out = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t())
        outputs[0].copy_(out.reshape(outputs[0].shape))

    return launch
