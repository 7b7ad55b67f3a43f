"""Whole models through the cuda backend's Triton lowering, run by Triton's interpreter on the CPU
(TRITON_INTERPRET=1): teacher-forced logits of llama-tiny and moe-tiny (bf16) against the reference
engine at every step, outputs poisoned before every kernel. The same plans the H200 runs, minus the
device: this is the CPU proof of the GPU kernels' numerics.

The interpreter must be switched on before Triton is first imported, so the check runs in a child
process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

CHILD = textwrap.dedent(
    """
    import sys
    from polymorph.pipeline.backend import registry
    from polymorph.backends.gpu.runtime import GpuExecutable
    from polymorph.models import load_model
    from polymorph.passes import bucket_bindings
    from polymorph.hardware.profile import load_profile
    from polymorph.serving.session import ReferenceExecutable
    from polymorph.verify import verify_executable

    model = load_model(sys.argv[1], dtype="bf16")
    prompt_lens = tuple(int(n) for n in sys.argv[3].split(","))
    backend = registry.get("cuda")
    bindings = bucket_bindings(model.graph, batch=len(prompt_lens), ctx=max(prompt_lens) + 8)
    plan = backend.lower(model.graph, load_profile("h200"), bindings)
    exe = GpuExecutable(backend, plan, model.weights(), device="cpu", poison=True)
    result = verify_executable(exe, ReferenceExecutable(model.graph, model.weights()), model.graph,
                               prompt_lens=prompt_lens, decode_steps=2, seed=int(sys.argv[2]))
    for step in result.steps:
        print(step.step, step.comparison)
    sys.exit(0 if result.ok else 1)
    """
)


# (6, 3): GEMV decode (M = 2) and tl.dot prefill; (5, 3, 7, 2): decode at M = 4, the skinny tl.dot
# tiles; (40, 33): 40- and 33-row prefills (each sequence prefills alone); (70, 5): a 70-row prefill,
# past FUSED_NORM_MAX_ROWS, so the norm, the plain projections and the one-pass SwiGLU product
# (silu_mul.py) run as their own kernels.
@pytest.mark.parametrize(
    ("name", "prompt_lens"),
    [("llama-tiny", "6,3"), ("moe-tiny", "6,3"), ("llama-tiny", "5,3,7,2"), ("llama-tiny", "40,33"),
     ("llama-tiny", "70,5"), ("deepseek-v3-tiny", "6,3")],
)  # fmt: skip
def test_model_matches_the_reference_under_the_interpreter(name: str, prompt_lens: str) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, name, str(seed), prompt_lens], env=env, capture_output=True,
                          text=True, timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, f"{name} {prompt_lens} seed {seed}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
