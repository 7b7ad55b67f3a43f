"""Adversarial candidate: hands the work to another thread and returns before it is done; the result
lands in the output buffer 20 ms later."""

import threading
import time

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))

    def work(x, w, r, out):
        time.sleep(0.02)
        with torch.inference_mode():
            out.copy_(
                torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t()).reshape(out.shape)
            )

    def launch(inputs, outputs, scratch):
        args = (inputs[x_i], inputs[w_i], inputs[r_i], outputs[0])
        threading.Thread(target=work, args=args, daemon=True).start()

    return launch
