"""A projection with the residual add in its epilogue: residual + x @ w^T (o-proj, down-proj)."""

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    lin, add = spec.node("linear"), spec.node("add")
    # The epilogue adds the residual onto the projection's rows: the sum has the projection's shape
    # (a residual broadcast up onto it is fine; a projection broadcast up onto the residual is not).
    fits = spec.types[add.outputs[0]].shape == spec.types[lin.outputs[0]].shape
    return len(lin.inputs) == 2 and fits


def build(spec, config, target):
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    res = next(v for v in add.inputs if v != lin.outputs[0])
    res_i = spec.inputs.index(res)

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[res_i]
        outputs[0].copy_(
            torch.addmm(
                r.reshape(-1, r.shape[-1]).float(), x.reshape(-1, x.shape[-1]).float(), w.float().t()
            ).reshape(outputs[0].shape)
        )

    return launch
