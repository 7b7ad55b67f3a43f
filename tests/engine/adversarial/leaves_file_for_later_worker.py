"""Adversarial candidate: leaves a file where the next worker looks. At build it writes into the folder
its environment names as polymorph's compile cache (POLYMORPH_CACHE_DIR: on neuron the NEFF cache,
knobs.cache_dir/neuron, that a stock kernel's compile reads), and raises if an earlier worker's file is
already there. A worker that cannot outlive itself never finds one: a copy of the zygote whose cache
folder is the zygote's own (never wiped between workers) does, and a candidate could plant a
compiled artifact there for a later worker's stock kernel to load."""

import os

import torch

IMPLEMENTS = ("elementwise", "reduction")
CONFIGS = [{}]
MARK = "planted-by-an-earlier-worker"


def supports(spec):
    return len(spec.outputs) == 1


def build(spec, config, target):
    folder = os.path.join(os.environ.get("POLYMORPH_CACHE_DIR", os.environ.get("TMPDIR", "/tmp")), "neuron")
    mark = os.path.join(folder, MARK)
    if os.path.exists(mark):
        raise RuntimeError(f"an earlier worker's file is here: {mark}")
    os.makedirs(folder, exist_ok=True)
    with open(mark, "w") as f:
        f.write(str(os.getpid()))

    def launch(inputs, outputs, scratch):  # the test's group: neg(x) * 3, x its first input
        outputs[0].copy_(torch.neg(inputs[0].float()) * 3.0)

    return launch
