"""Rotary position embedding (rotate-half layout) of every rope type, on the first rotary_dim dims of
each head (the rest passed through), cos and sin times the attention factor.

The frequencies come from `polymorph.ir.reference.rope_inv_freq`: once at build for the static types;
per call for "dynamic" and "longrope", from the call's max(positions) + 1 (read on the host: the cpu
backend has no graph capture to keep the positions on the device for)."""

import torch

from polymorph.ir.ops import rope_rotary_dim
from polymorph.ir.reference import rope_inv_freq

IMPLEMENTS = "rope"
CONFIGS = [{}]

# The rope types whose frequencies depend on the sequence length of the call.
PER_CALL = ("dynamic", "longrope")


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    node = spec.single
    x_i, pos_i = spec.args(node)
    attrs = spec.attrs()
    head_dim = spec.types[node.inputs[0]].shape[-1]
    dim = rope_rotary_dim(attrs, head_dim)
    half = dim // 2
    factor = attrs["attention_factor"]
    per_call = attrs["rope_type"] in PER_CALL
    static_inv = torch.from_numpy(rope_inv_freq(head_dim, attrs))  # [dim / 2]

    def launch(inputs, outputs, scratch):
        x = inputs[x_i].float()  # [B, S, H, Dh]
        pos = inputs[pos_i]
        inv = static_inv
        if per_call and pos.numel():
            inv = torch.from_numpy(rope_inv_freq(head_dim, attrs, seq_len=int(pos.max()) + 1))
        angles = pos.float()[..., None] * inv  # [B, S, dim / 2]
        cos = angles.cos()[:, :, None, :] * factor
        sin = angles.sin()[:, :, None, :] * factor
        x1, x2 = x[..., :half], x[..., half:dim]
        outputs[0][..., :half].copy_(x1 * cos - x2 * sin)
        outputs[0][..., half:dim].copy_(x2 * cos + x1 * sin)
        if dim < head_dim:
            outputs[0][..., dim:].copy_(inputs[x_i][..., dim:])

    return launch
