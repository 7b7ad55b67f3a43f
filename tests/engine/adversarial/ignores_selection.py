"""Adversarial candidate for DeepSeek-V3.2's sparse attention: it attends over every visible position
of the cache, not only those its indexer selected (dense attention is what a kernel that skips the
selection computes): state the query was not given reaches its output."""

import torch

IMPLEMENTS = "index_attention"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    args = spec.args(spec.single)
    scale = spec.attrs()["scale"]

    def launch(inputs, outputs, scratch):
        q, kc, vc, table, pos = (inputs[i] for i in args[:5])
        b, blocks = table.shape
        _, block_size, hkv, d = kc.shape
        table = table.long()
        k = kc[table].reshape(b, blocks * block_size, hkv, d).float()
        v = vc[table].reshape(b, blocks * block_size, hkv, vc.shape[-1]).float()
        visible = torch.arange(blocks * block_size)[None, None, :] <= pos.long()[:, :, None]
        rep = q.shape[2] // hkv
        qh = q.float().transpose(1, 2)
        kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        vh = torch.nan_to_num(v.transpose(1, 2).repeat_interleave(rep, dim=1))
        scores = (qh @ kh.transpose(-1, -2)) * scale
        scores = torch.nan_to_num(scores, nan=0.0).masked_fill(~visible[:, None], float("-inf"))
        outputs[0].copy_((scores.softmax(-1) @ vh).transpose(1, 2))

    return launch
