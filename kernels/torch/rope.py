"""Rotary position embedding (rotate-half layout), llama3 frequency scaling included."""

import torch

from polymorph.ir.reference import rope_inv_freq

IMPLEMENTS = "rope"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    node = spec.single
    x_i, pos_i = spec.args(node)
    head_dim = spec.types[node.inputs[0]].shape[-1]
    inv_freq = torch.from_numpy(rope_inv_freq(head_dim, spec.attrs()))  # [Dh/2]
    half = head_dim // 2

    def launch(inputs, outputs, scratch):
        x = inputs[x_i].float()  # [B, S, H, Dh]
        angles = inputs[pos_i].float()[..., None] * inv_freq  # [B, S, Dh/2]
        cos = angles.cos()[:, :, None, :]
        sin = angles.sin()[:, :, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        outputs[0][..., :half].copy_(x1 * cos - x2 * sin)
        outputs[0][..., half:].copy_(x2 * cos + x1 * sin)

    return launch
