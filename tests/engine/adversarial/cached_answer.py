"""Adversarial candidate: computes once per shape, then returns the answer of that earlier call."""

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))
    answers = {}

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        key = tuple(outputs[0].shape)
        if key not in answers:
            answers[key] = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t()).reshape(
                outputs[0].shape
            )
        outputs[0].copy_(answers[key])

    return launch
