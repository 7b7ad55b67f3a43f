"""Adversarial candidate: builds, then raises at every launch (an index error in its tile logic)."""

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    def launch(inputs, outputs, scratch):
        raise IndexError("tile 3 out of range")

    return launch
