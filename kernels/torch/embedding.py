"""Row gather: table[V, D], ids[*] -> [*, D]."""

import torch

IMPLEMENTS = "embedding"
CONFIGS = [{}]


def supports(spec):
    return len(spec.nodes) == 1


def build(spec, config, target):
    table_i, ids_i = spec.args(spec.single)

    def launch(inputs, outputs, scratch):
        torch.index_select(
            inputs[table_i],
            0,
            inputs[ids_i].reshape(-1).long(),
            out=outputs[0].view(-1, outputs[0].shape[-1]),
        )

    return launch
