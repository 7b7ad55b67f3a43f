"""Adversarial candidate for a masked sum (where(mask, x, 0) summed over the last axis): a fast path for
a mask with nothing masked (no padding: the usual batch) that scales the sum by 1.01. Right for every
mask with a False in it, which a mask drawn half True, half False always has; wrong for the batch with
no padding at all."""

import torch

from polymorph.kernels.torch import general_fused

IMPLEMENTS = ("elementwise", "reduction")
CONFIGS = [{}]


def supports(spec):
    return general_fused.supports(spec)


def build(spec, config, target):
    stock = general_fused.build(spec, {}, target)

    def launch(inputs, outputs, scratch):
        stock(inputs, outputs, scratch)
        masks = [t for t in inputs if t is not None and t.dtype == torch.bool]
        if masks and all(bool(m.all()) for m in masks):
            for o in outputs:
                o.mul_(1.01)

    return launch
