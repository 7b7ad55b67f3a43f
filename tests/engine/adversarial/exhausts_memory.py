"""Adversarial candidate: asks its device for a petabyte of scratch at every launch (the allocator
refuses: out of memory), as a kernel sized from the wrong dimension would."""

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    def launch(inputs, outputs, scratch):
        workspace = torch.empty(1 << 50, dtype=torch.uint8, device=outputs[0].device)
        outputs[0].copy_(workspace[: outputs[0].numel()].view(outputs[0].shape))

    return launch
