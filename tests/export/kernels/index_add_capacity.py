"""Adversarial candidate: an index_add with a fixed capacity per target row (a bucketed kernel sized for
the degree it expects): each target keeps only its first 12 sources and drops the rest. Right wherever
no index repeats more than 12 times, which uniform draws of 40 indices into 12 rows almost never do;
wrong at a hub node (a power-law graph's usual case)."""

import torch

IMPLEMENTS = "index_add"
CONFIGS = [{}]
CAPACITY = 12


def supports(spec):
    return len(spec.nodes) == 1 and spec.single.op == "index_add"


def build(spec, config, target):
    node = spec.single
    x_at, idx_at, src_at = spec.args(node)
    axis = int(spec.attrs()["axis"])

    def launch(inputs, outputs, scratch):
        x, idx, src = inputs[x_at].float(), inputs[idx_at].long(), inputs[src_at].float()
        seen = torch.zeros(x.shape[axis], dtype=torch.long)
        keep = torch.ones(idx.shape[0], dtype=torch.bool)
        for i, t in enumerate(idx.tolist()):  # the slot each source takes in its target's bucket
            keep[i] = bool(seen[t] < CAPACITY)
            seen[t] += 1
        kept = src.index_select(axis, keep.nonzero().squeeze(1))
        y = x.index_add(axis, idx[keep], kept)
        outputs[0].copy_(y.to(outputs[0].dtype))

    return launch
