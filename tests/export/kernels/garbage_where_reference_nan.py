"""Adversarial candidate for a fused elementwise group whose reference output holds NaN on the gate's
draws (sqrt or log of a drawn input that the program only ever feeds positive values): it returns
3 * x + 1 for every element, right nowhere. A numerics gate that gives up on a case where the stock
kernel's error is not finite (NaN where the reference has NaN counted as an infinite error, so the bar
of four times the stock kernel's error is infinite) passes it."""

IMPLEMENTS = ("elementwise", "reduction")
CONFIGS = [{}]


def supports(spec):
    return len(spec.outputs) == 1


def build(spec, config, target):
    def launch(inputs, outputs, scratch):
        x = next(t for t in inputs if t.is_floating_point())
        outputs[0].copy_((3 * x.float() + 1).expand_as(outputs[0]).to(outputs[0].dtype))

    return launch
