"""Adversarial candidate for bit-exact mode: the stock fused kernel's own launch for its first calls,
then the same answer scaled by (1 + 2^-20): within every tolerance, not bit-exact. The `exact` gate
compares the group gates' few calls; a bar that held the many timed calls after them only to the
tolerance passed it (and timed the inexact path)."""

from polymorph.kernels.torch import general_fused

IMPLEMENTS = ("elementwise", "reduction")
CONFIGS = [{}]
EXACT_CALLS = 16


def supports(spec):
    return general_fused.supports(spec)


def build(spec, config, target):
    stock = general_fused.build(spec, {}, target)
    calls = [0]

    def launch(inputs, outputs, scratch):
        stock(inputs, outputs, scratch)
        calls[0] += 1
        if calls[0] > EXACT_CALLS:
            for o in outputs:
                o.mul_(1 + 2**-20)

    return launch
