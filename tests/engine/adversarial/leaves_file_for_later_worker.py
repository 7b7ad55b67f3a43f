"""Adversarial candidate: leaves a file where the next worker looks. At build it writes into the folder
its environment names as polymorph's compile cache (POLYMORPH_CACHE_DIR: on neuron the NEFF cache,
knobs.cache_dir/neuron, that a stock kernel's compile reads), or with {"folder": "shm"} into /dev/shm,
and raises if an earlier worker's file is already there. A worker that cannot outlive itself never finds one: a copy of the zygote whose cache
folder is the zygote's own (never wiped between workers) does, and a candidate could plant a
compiled artifact there for a later worker's stock kernel to load."""

import os
import zlib

import torch

IMPLEMENTS = ("elementwise", "reduction")
CONFIGS = [{"folder": "cache"}, {"folder": "shm"}]
MARK = "planted-by-an-earlier-worker"


def supports(spec):
    return len(spec.outputs) == 1


def build(spec, config, target):
    if config.get("folder") == "shm":  # the worker's /dev/shm (private to the zygote's sandbox)
        folder = "/dev/shm"
    else:
        folder = os.path.join(
            os.environ.get("POLYMORPH_CACHE_DIR", os.environ.get("TMPDIR", "/tmp")), "neuron"
        )
    # one test's mark, not another's: the test names it (not the worker's own folders, which differ)
    mark = os.path.join(folder, f"{MARK}-{zlib.crc32(str(config.get('token', '')).encode()):08x}")
    if os.path.exists(mark):
        raise RuntimeError(f"an earlier worker's file is here: {mark}")
    os.makedirs(folder, exist_ok=True)
    with open(mark, "w") as f:
        f.write(str(os.getpid()))

    def launch(inputs, outputs, scratch):  # the test's group: neg(x) * 3, x its first input
        outputs[0].copy_(torch.neg(inputs[0].float()) * 3.0)

    return launch
