"""Adversarial candidate: the stock fused kernel's answer with its inputs clamped to float16's range
(±65504: an "overflow-safe" kernel written for half precision). Right for every input under 65504 in
magnitude, which is every normal, uniform (±1e3) or outlier (±1e4) draw; wrong for a larger one."""

from polymorph.kernels.torch import general_fused

IMPLEMENTS = ("elementwise", "reduction")
CONFIGS = [{}]


def supports(spec):
    return general_fused.supports(spec)


def build(spec, config, target):
    stock = general_fused.build(spec, {}, target)

    def launch(inputs, outputs, scratch):
        clamped = [
            t.clamp(-65504.0, 65504.0) if t is not None and t.is_floating_point() else t for t in inputs
        ]
        stock(clamped, outputs, scratch)

    return launch
