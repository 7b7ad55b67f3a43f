"""Adversarial candidate: an index_select with a fast path for sorted indices (runs of one row copied as
a block, CSR-style) whose run boundaries are off by one: each run's first row reads the row before.
Right on every unsorted index list, which is all a uniform draw of 40 indices ever is."""

import torch

IMPLEMENTS = "index_select"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1 and spec.single.op == "index_select"


def build(spec, config, target):
    node = spec.single
    x_at, idx_at = spec.args(node)
    axis = int(spec.attrs()["axis"])

    def launch(inputs, outputs, scratch):
        x, idx = inputs[x_at], inputs[idx_at].long()
        if idx.numel() > 1 and bool((idx[1:] >= idx[:-1]).all()):
            starts = torch.ones_like(idx, dtype=torch.bool)
            starts[1:] = idx[1:] != idx[:-1]
            idx = torch.where(starts, (idx - 1).clamp(min=0), idx)
        outputs[0].copy_(torch.index_select(x, axis, idx).to(outputs[0].dtype))

    return launch
