"""A projection per head: x[*, H, K], w[H, N, K] -> [*, H, N] (MLA's absorbed up-projections), in f32."""

import torch

IMPLEMENTS = "head_linear"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    node = spec.single
    x_i, w_i = spec.args(node)

    def launch(inputs, outputs, scratch):
        x, w = inputs[x_i].float(), inputs[w_i].float()
        outputs[0].copy_(torch.einsum("...hk,hnk->...hn", x, w))

    return launch
