"""Adversarial candidate for DeepSeek-V3.2's indexer: in a batch of several sequences, every sequence's
positions are scored against the first sequence's indexer cache (its block table for all): the
choice of positions then leaks one sequence's state into another's attention, which batch 1 never
shows."""

import torch

IMPLEMENTS = "indexer_topk"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    q_i, cache_i, w_i, table_i, pos_i = spec.args(spec.single)
    attrs = spec.attrs()
    k, scale = attrs["k"], attrs["scale"]

    def launch(inputs, outputs, scratch):
        q, cache, w = inputs[q_i].float(), inputs[cache_i], inputs[w_i].float()
        table, pos = inputs[table_i].long(), inputs[pos_i].long()
        b, blocks = table.shape
        if b > 1:
            table = table[:1].expand(b, -1)
        keys = cache[table].reshape(b, blocks * cache.shape[1], cache.shape[-1]).float()  # [B, T, D]
        dots = torch.einsum("bshd,btd->bsht", q, keys) * scale
        scores = torch.einsum("bsh,bsht->bst", w, dots.clamp(min=0))
        t = torch.arange(keys.shape[1])
        scores = scores.masked_fill(t[None, None, :] > pos[:, :, None], float("-inf"))
        order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
        best = scores.gather(-1, order)
        out = torch.where(torch.isfinite(best), order, torch.full_like(order, -1))
        if out.shape[-1] < k:
            pad = torch.full((*out.shape[:-1], k - out.shape[-1]), -1, dtype=out.dtype)
            out = torch.cat([out, pad], dim=-1)
        outputs[0].copy_(out)

    return launch
