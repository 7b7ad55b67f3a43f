"""Adversarial candidate: memoizes its answer by the address of its input buffer, as a kernel that
learned that a benchmark reuses its buffers would: right the first time a buffer is seen, stale after."""

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))
    seen = {}

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        key = (x.data_ptr(), r.data_ptr(), tuple(x.shape))
        if key not in seen:
            seen[key] = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t()).clone()
        outputs[0].copy_(seen[key].reshape(outputs[0].shape))

    return launch
