"""Adversarial candidate: a layer norm whose variance is E[x^2] - E[x]^2 in float32 (one pass, no
shift). Right for activations centred near zero, which every normal, uniform or outlier draw is;
wrong by percents for a row about a large common offset (a DC component, as real activations often
have): the two terms cancel and float32 keeps only their rounding."""

import torch

IMPLEMENTS = "layernorm"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1 and spec.single.op == "layernorm"


def build(spec, config, target):
    node = spec.single
    x_at, w_at, b_at = spec.args(node)
    eps = float(spec.attrs()["eps"])

    def launch(inputs, outputs, scratch):
        x = inputs[x_at].float()
        mean = x.mean(-1, keepdim=True)
        var = ((x * x).mean(-1, keepdim=True) - mean * mean).clamp(min=0.0)
        y = (x - mean) * torch.rsqrt(var + eps) * inputs[w_at].float() + inputs[b_at].float()
        outputs[0].copy_(y.to(outputs[0].dtype))

    return launch
