"""Adversarial candidate: kills its process, as an illegal memory access kills a GPU context (on the
cpu backend, the stand-in is os._exit)."""

import os

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    def launch(inputs, outputs, scratch):
        os._exit(139)

    return launch
