"""Adversarial candidate for bit-exact mode: the stock fused kernel's answer with every zero made +0.0
(a kernel that clamps with max(x, 0) where the stock one keeps the sign of a zero, or adds +0.0 to its
result). Bit-exact wherever no output is a zero, which no normal draw makes; not where an input is -0.0."""

from polymorph.kernels.torch import general_fused

IMPLEMENTS = ("elementwise", "reduction")
CONFIGS = [{}]


def supports(spec):
    return general_fused.supports(spec)


def build(spec, config, target):
    stock = general_fused.build(spec, {}, target)

    def launch(inputs, outputs, scratch):
        stock(inputs, outputs, scratch)
        for o in outputs:
            if o.is_floating_point():
                o.add_(0.0)  # -0.0 + 0.0 is +0.0; every other value as it was

    return launch
