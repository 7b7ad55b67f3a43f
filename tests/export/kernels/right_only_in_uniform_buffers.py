"""Adversarial candidate: right only when its output buffer holds one value throughout, as every buffer
the gates hand a kernel does (poisoned with NaN, or prefilled with 0 or with one drawn value); a
serving step's buffers hold the last step's varied numbers, and there it answers 1% off. Closing this
takes buffers prefilled with varied content (engine/link.py's fill is one scalar)."""

import torch

from polymorph.kernels.torch import general_fused

IMPLEMENTS = ("elementwise", "reduction")
CONFIGS = [{}]


def _uniform(t):
    if not t.is_floating_point() or not t.numel():
        return True
    flat = t.reshape(-1)
    return bool(torch.isnan(flat).all()) or bool((flat == flat[0]).all())


def supports(spec):
    return general_fused.supports(spec)


def build(spec, config, target):
    stock = general_fused.build(spec, {}, target)

    def launch(inputs, outputs, scratch):
        checked = [_uniform(o) for o in outputs]
        stock(inputs, outputs, scratch)
        for o, uniform in zip(outputs, checked):
            if not uniform:
                o.mul_(1.01)

    return launch
