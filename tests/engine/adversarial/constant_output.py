"""Adversarial candidate: writes every element, always the same value, whatever the inputs."""

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    def launch(inputs, outputs, scratch):
        outputs[0].fill_(0.125)

    return launch
