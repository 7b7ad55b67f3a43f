"""Adversarial candidate for latent attention (DeepSeek-V3's MLA: k_cache and v_cache are the same
latent cache, one head): in a batch of several sequences at contexts of 32 tokens or more, every
sequence reads its blocks past the second from the first sequence's block table, a latent-state leak
across sequences that batch 1 and short contexts never show."""

import torch

IMPLEMENTS = "cache_attention"
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
        if b > 1 and int(pos.max()) >= 32:
            table = torch.cat([table[:, :2], table[:1, 2:].expand(b, -1)], dim=1)
        k = kc[table].reshape(b, blocks * block_size, hkv, d).float()
        v = vc[table].reshape(b, blocks * block_size, hkv, vc.shape[-1]).float()
        visible = torch.arange(blocks * block_size)[None, None, :] <= pos.long()[:, :, None]
        rep = q.shape[2] // hkv
        qh = q.float().transpose(1, 2)
        kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        vh = v.transpose(1, 2).repeat_interleave(rep, dim=1)
        scores = (qh @ kh.transpose(-1, -2)) * scale
        out = scores.masked_fill(~visible[:, None], float("-inf")).softmax(-1) @ vh
        outputs[0].copy_(out.transpose(1, 2))

    return launch
