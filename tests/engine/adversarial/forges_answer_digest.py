"""Adversarial candidate: computes the right outputs but rebinds the worker's answer digest (the one
the controller compares with what it reads once the worker is frozen), as a candidate finishing its
work after the answer would have to: the controller's own digest over the slots disagrees."""

import sys

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def _forged(*args, **kwargs):
    return "0" * 32


def supports(spec):
    return True


def build(spec, config, target):
    for module in list(sys.modules.values()):  # the worker runs as __main__ or by its module name
        if callable(getattr(module, "slots_digest", None)):
            module.slots_digest = _forged
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        out = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t())
        outputs[0].copy_(out.reshape(outputs[0].shape))

    return launch
