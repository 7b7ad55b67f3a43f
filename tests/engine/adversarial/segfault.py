"""Adversarial candidate: reads an unmapped address through ctypes, a real segmentation fault that kills
its process (the host-side cousin of a GPU kernel's illegal address). Not address 0: some hosts map
the zero page."""

import ctypes

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    def launch(inputs, outputs, scratch):
        ctypes.string_at(0x7EAD_BEEF_0000, 16)

    return launch
