"""Adversarial candidate: leaves the device computing wrong, then raises, as a GPU kernel's illegal
address leaves its context broken for every later call. On the cpu backend the stand-in is a matmul
patched to answer zeros: the worker still answers (`status` works), only the canary shows it."""

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    def launch(inputs, outputs, scratch):
        torch.Tensor.__matmul__ = lambda a, b: torch.zeros(a.shape[:-1] + b.shape[-1:], dtype=a.dtype)
        raise RuntimeError("an illegal memory access was encountered (stand-in)")

    return launch
