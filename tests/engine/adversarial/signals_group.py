"""Adversarial candidate: at build, sends SIGKILL to its whole process group and to every process it
can, as a kernel that wants the controller (which would judge it) gone would."""

import os
import signal

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def supports(spec):
    return True


def build(spec, config, target):
    for pid in range(1, 4 << 15):
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    os.killpg(os.getpgrp(), signal.SIGKILL)
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        outputs[0].copy_(
            torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t()).reshape(
                outputs[0].shape
            )
        )

    return launch
