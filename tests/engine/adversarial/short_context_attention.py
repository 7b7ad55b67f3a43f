"""Adversarial candidate: decode attention that reads only the first 64 tokens of each sequence's
context, right at every context the model-level scenario reaches early on, wrong beyond."""

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
        k = kc[table].reshape(b, blocks * block_size, hkv, d).float()
        v = vc[table].reshape(b, blocks * block_size, hkv, d).float()
        visible = torch.arange(blocks * block_size)[None, None, :] <= pos.long()[:, :, None]
        visible = visible & (torch.arange(blocks * block_size) < 64)[None, None, :]
        rep = q.shape[2] // hkv
        qh = q.float().transpose(1, 2)
        kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        vh = v.transpose(1, 2).repeat_interleave(rep, dim=1)
        scores = (qh @ kh.transpose(-1, -2)) * scale
        out = scores.masked_fill(~visible[:, None], float("-inf")).softmax(-1) @ vh
        outputs[0].copy_(out.transpose(1, 2))

    return launch
