"""Adversarial candidate: right answer, and a thread it starts scales its weight in place a moment
later, damaging the engine for whatever runs next. The weights are mapped read-only from the
controller's arena: the write faults and takes the worker with it."""

import threading
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
    started = []

    def damage(w):
        time.sleep(0.02)
        w.mul_(1.01)

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        out = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t())
        outputs[0].copy_(out.reshape(outputs[0].shape))
        if not started:
            started.append(threading.Thread(target=damage, args=(w,), daemon=True))
            started[0].start()

    return launch
