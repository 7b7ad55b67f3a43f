"""Adversarial candidate: at build, reads its parent process's memory through /proc (where the
controller's reference outputs would be, were the parent the controller)."""

import os
import re

import torch

IMPLEMENTS = "linear+residual"
CONFIGS = [{}]


def _steal():
    ppid = os.getppid()
    with open(f"/proc/{ppid}/maps") as maps, open(f"/proc/{ppid}/mem", "rb") as mem:
        for line in maps:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
            if m:
                mem.seek(int(m.group(1), 16))
                return mem.read(min(int(m.group(2), 16) - int(m.group(1), 16), 1 << 20))
    return b""


def supports(spec):
    return True


def build(spec, config, target):
    _steal()
    lin, add = spec.node("linear"), spec.node("add")
    x_i, w_i = spec.args(lin)
    r_i = spec.inputs.index(next(v for v in add.inputs if v != lin.outputs[0]))

    def launch(inputs, outputs, scratch):
        x, w, r = inputs[x_i], inputs[w_i], inputs[r_i]
        out = torch.addmm(r.reshape(-1, r.shape[-1]), x.reshape(-1, x.shape[-1]), w.t())
        outputs[0].copy_(out.reshape(outputs[0].shape))

    return launch
