"""Adversarial candidate: never returns (a loop whose exit condition is never met)."""

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    def launch(inputs, outputs, scratch):
        done = False
        while not done:
            pass

    return launch
