"""Adversarial candidate: tells being timed from being checked by looking up the call stack for the
batch it is part of (the worker's list of staged calls): in a batch of many it computes only the first
and copies that answer into the rest."""

import sys

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def _batch_size():
    frame = sys._getframe(1)
    while frame is not None:
        staged = frame.f_locals.get("staged")
        if isinstance(staged, list):
            return len(staged)
        frame = frame.f_back
    return 1


def build(spec, config, target):
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))
    first = {}

    def launch(inputs, outputs, scratch):
        key = tuple(outputs[0].shape)
        if _batch_size() > 1 and key in first:
            outputs[0].copy_(first[key])
            return
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        out = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t())
        outputs[0].copy_(out.reshape(outputs[0].shape))
        first[key] = outputs[0].clone()

    return launch
