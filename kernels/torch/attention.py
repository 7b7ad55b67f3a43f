"""Attention through torch's scaled_dot_product_attention: causal, and over the paged KV cache."""

import torch
import torch.nn.functional as F

IMPLEMENTS = ("attention", "cache_attention")
# "sdpa": torch's fused kernel with a boolean mask; "math": explicit softmax(q k^T) v in float32.
CONFIGS = [{"impl": "sdpa"}, {"impl": "math"}]


def supports(spec):
    return len(spec.nodes) == 1


def _attend(q, k, v, visible, scale, impl):
    # q: [B, S, H, Dh], k/v: [B, T, Hkv, Dh], visible: [B, S, T]
    rep = q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2).float() for t in (q, k, v))  # [B, H, S, Dh]
    mask = visible[:, None]  # [B, 1, S, T]
    if impl == "sdpa":  # grouped query heads read their kv head in place (no repeated copy of K and V)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=rep > 1)
    else:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-1, -2)) * scale
        out = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
    return out.transpose(1, 2)  # [B, S, H, Dh]


def build(spec, config, target):
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    scale, impl = attrs["scale"], config["impl"]

    if node.op == "attention":

        def launch(inputs, outputs, scratch):
            q, k, v = (inputs[i] for i in args)
            s, t = q.shape[1], k.shape[1]
            visible = torch.ones(q.shape[0], s, t, dtype=torch.bool)
            if attrs["causal"]:
                visible = visible.tril()
            outputs[0].copy_(_attend(q, k, v, visible, scale, impl))

        return launch

    def launch_cache(inputs, outputs, scratch):
        q, kc, vc, table, pos = (inputs[i] for i in args)
        b, blocks = table.shape
        _, block_size, hkv, d = kc.shape
        rows = table.reshape(-1).long()  # index_select: one gather kernel, half the cost of kc[table]
        k = kc.index_select(0, rows).view(b, blocks * block_size, hkv, d)  # [B, T, Hkv, Dh] in logical order
        v = vc.index_select(0, rows).view(b, blocks * block_size, hkv, d)
        t = torch.arange(blocks * block_size)
        visible = t[None, None, :] <= pos.long()[:, :, None]  # [B, S, T]
        outputs[0].copy_(_attend(q, k, v, visible, scale, impl))

    return launch_cache
