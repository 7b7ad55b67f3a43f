"""Adversarial candidate: windowed attention that reads every block of the block table and applies
the window by multiplying the values by the mask: right on any cache whose released blocks hold finite
values, NaN where a block that slid out of the window holds NaN (0 * NaN)."""

import torch

IMPLEMENTS = "cache_attention"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    args = spec.args(spec.single)
    attrs = spec.attrs()
    scale, window, softcap = attrs["scale"], attrs["window"], attrs["softcap"]

    def launch(inputs, outputs, scratch):
        q, kc, vc, table, pos = (inputs[i] for i in args)
        b, s, h, d = q.shape
        _, block_size, hkv, _ = kc.shape
        rep = h // hkv
        for i in range(b):
            p = pos[i].long()  # [S]
            lo, hi = 0, table.shape[1]  # every block of the table, the window masked below
            blocks = table[i, lo:hi].long()
            k = kc.index_select(0, blocks).reshape(-1, hkv, d).float()  # [T, Hkv, Dh]
            v = vc.index_select(0, blocks).reshape(-1, hkv, d).float()
            t = torch.arange(lo * block_size, hi * block_size)
            visible = t[None, :] <= p[:, None]  # [S, T]
            if window:
                visible &= t[None, :] > p[:, None] - window
            qh = q[i].float().transpose(0, 1)  # [H, S, Dh]
            kh = k.transpose(0, 1).repeat_interleave(rep, 0)  # [H, T, Dh]
            vh = v.transpose(0, 1).repeat_interleave(rep, 0)
            scores = (qh @ kh.transpose(-1, -2)) * scale
            if softcap:
                scores = softcap * torch.tanh(scores / softcap)
            probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
            vh = vh * visible.any(0)[None, :, None]  # masked by multiplication: 0 * NaN is NaN
            outputs[0][i].copy_((probs @ vh).transpose(0, 1))

    return launch
