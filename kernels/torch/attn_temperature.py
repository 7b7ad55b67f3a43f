"""Llama 4's attention temperature on its layers without rope: x * (log1p(floor((p + 1) / floor_scale))
* scale + 1) per token, in f32, as transformers computes it."""

import torch

IMPLEMENTS = "attn_temperature"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    node = spec.single
    x_i, pos_i = spec.args(node)
    attrs = spec.attrs()
    floor_scale, scale = float(attrs["floor_scale"]), float(attrs["scale"])

    def launch(inputs, outputs, scratch):
        p = inputs[pos_i].float()  # [B, S]
        factor = torch.log1p(torch.floor((p + 1.0) / floor_scale)) * scale + 1.0
        outputs[0].copy_(inputs[x_i].float() * factor[:, :, None, None])

    return launch
