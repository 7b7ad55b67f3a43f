"""Adversarial candidate: attention that, in a batch of several sequences at contexts of 48 tokens or
more, reads the later blocks of every sequence from the first sequence's block table: a KV leak across
sequences that short contexts and batch 1 never show."""

import torch

IMPLEMENTS = "cache_attention"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    args = spec.args(spec.single)
    scale = spec.attrs()["scale"]

    def launch(inputs, outputs, scratch):
        q, kc, vc, table, pos = (inputs[i] for i in args)
        b, blocks = table.shape
        _, block_size, hkv, d = kc.shape
        table = table.long()
        if b > 1 and int(pos.max()) >= 48:
            table = torch.cat([table[:, :3], table[:1, 3:].expand(b, -1)], dim=1)
        k = kc[table].reshape(b, blocks * block_size, hkv, d).float()
        v = vc[table].reshape(b, blocks * block_size, hkv, d).float()
        visible = torch.arange(blocks * block_size)[None, None, :] <= pos.long()[:, :, None]
        rep = q.shape[2] // hkv
        qh = q.float().transpose(1, 2)
        kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        vh = v.transpose(1, 2).repeat_interleave(rep, dim=1)
        scores = (qh @ kh.transpose(-1, -2)) * scale
        out = scores.masked_fill(~visible[:, None], float("-inf")).softmax(-1) @ vh
        outputs[0].copy_(out.transpose(1, 2))

    return launch
