"""Adversarial candidate: right only when its output buffer holds NaN, the gates' poison. Every call the
numerics, exact and timing gates judge comes into buffers poisoned with NaN; a serving step's buffers
hold the last step's numbers. So it computes the stock answer where the buffer held NaN and the answer
1% off otherwise, the same wrong answer whatever else the buffer held: a prefill gate that compared
the 0-filled and -7.5-filled runs only with each other passed it."""

import torch

from polymorph.kernels.torch import general_fused

IMPLEMENTS = ("elementwise", "reduction")
CONFIGS = [{}]


def supports(spec):
    return general_fused.supports(spec)


def build(spec, config, target):
    stock = general_fused.build(spec, {}, target)

    def launch(inputs, outputs, scratch):
        checked = [bool(torch.isnan(o).any()) if o.is_floating_point() else True for o in outputs]
        stock(inputs, outputs, scratch)
        for o, poisoned in zip(outputs, checked):
            if not poisoned:
                o.mul_(1.01)

    return launch
