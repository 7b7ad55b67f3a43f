"""Rotary position embedding (rotate-half layout) of every rope type, on the first rotary_dim dims of
each head (the rest passed through), cos and sin times the attention factor.

The frequencies come from `polymorph.ir.reference.rope_inv_freq`: once at build for the static types;
per call for "dynamic" and "longrope", from the call's max(positions) + 1 (read on the host: the cpu
backend has no graph capture to keep the positions on the device for)."""

import torch

from polymorph.ir.ops import rope_rotary_dim
from polymorph.ir.reference import rope_inv_freq

IMPLEMENTS = "rope"
# angles "per_call": cos and sin of positions x frequencies computed in every call (about 20 torch ops);
# "table": cos and sin of every position up to the largest seen so far kept from the first call (grown
# by doubling when a call's position passes the end), each call gathers its rows and rotates in four
# ops (x * C + roll(x) * S, with S = [-sin, sin]). The table's rows are the same float32 products the
# per-call path computes (positions times frequencies, then cos and sin, then the factor), so the
# two agree bit for bit. The per-call rope types ("dynamic", "longrope") and negative positions take
# the per-call path whatever the config.
CONFIGS = [{"angles": "per_call"}, {"angles": "table"}]

# The rope types whose frequencies depend on the sequence length of the call.
PER_CALL = ("dynamic", "longrope")
# A table past this many positions is not kept (its memory would outgrow what it saves).
MAX_TABLE = 1 << 17


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

    def per_call_launch(inputs, outputs, scratch):
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

    if per_call or config.get("angles", "per_call") == "per_call":
        return per_call_launch

    # C: [n, dim] = [cos, cos], S: [n, dim] = [-sin, sin], for positions 0 .. n - 1
    table = {"C": torch.empty(0, dim), "S": torch.empty(0, dim)}

    def grow(pos):
        top = int(pos.max()) + 1
        if int(pos.min()) < 0 or top > MAX_TABLE:
            return False
        n = 1 << max(top - 1, 1).bit_length()  # the next power of two at or past top
        angles = torch.arange(n).float()[:, None] * static_inv  # [n, dim / 2]: as per call, row by row
        cos, sin = angles.cos() * factor, angles.sin() * factor
        table["C"] = torch.cat([cos, cos], -1)
        table["S"] = torch.cat([-sin, sin], -1)
        return True

    def launch(inputs, outputs, scratch):
        pos = inputs[pos_i]  # [B, S]
        x = inputs[x_i]  # [B, S, H, Dh]
        b, s, _, _ = x.shape
        try:
            c = table["C"].index_select(0, pos.reshape(-1))
        except (IndexError, RuntimeError):  # past the table's end (or a negative position)
            if not pos.numel() or not grow(pos):
                return per_call_launch(inputs, outputs, scratch)
            c = table["C"].index_select(0, pos.reshape(-1))
        sn = table["S"].index_select(0, pos.reshape(-1)).view(b, s, 1, dim)
        c = c.view(b, s, 1, dim)
        xf = x[..., :dim].float()
        rotated = xf.roll(half, -1)  # [x2, x1]: with S's signs, x1 * cos - x2 * sin and x2 * cos + x1 * sin
        out = outputs[0]
        if dim == head_dim and out.dtype == torch.float32:
            torch.mul(xf, c, out=out)
            out.add_(rotated * sn)
        else:
            out[..., :dim].copy_(xf * c + rotated * sn)
            if dim < head_dim:
                out[..., dim:].copy_(x[..., dim:])

    return launch
