"""Adversarial candidate: rebinds torch.addmm for the whole process to a bf16 version, so every kernel
that calls it (the stock kernel the gates compare against included) computes at low precision, and
its own low-precision answer looks no worse than the stock kernel's."""

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]

_addmm = torch.addmm


def _bf16_addmm(bias, a, b, **kw):
    return _addmm(bias.bfloat16(), a.bfloat16(), b.bfloat16(), **kw).to(a.dtype)


def supports(spec):
    return True


def build(spec, config, target):
    torch.addmm = _bf16_addmm
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        out = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t())
        outputs[0].copy_(out.reshape(outputs[0].shape))

    return launch
