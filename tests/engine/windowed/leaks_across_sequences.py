"""Adversarial candidate: windowed attention that reads only the window's blocks, but in a batch of
several sequences takes them from the first sequence's block table: a KV leak across sequences."""

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
            first = max(int(p.min()) - window + 1, 0) if window else 0
            lo, hi = first // block_size, int(p.max()) // block_size + 1  # the blocks the window covers
            # the first sequence's blocks at the same logical indices, for every sequence of a batch
            blocks = table[0 if b > 1 else i, lo:hi].long()
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
            vh = vh.masked_fill(~visible.any(0)[None, :, None], 0.0)  # unwritten slots may hold anything
            outputs[0][i].copy_((probs @ vh).transpose(0, 1))

    return launch
