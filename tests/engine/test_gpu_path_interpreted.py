"""The engine's GPU path (the cuda backend's GpuExecutable in the worker) on the CPU, under Triton's
interpreter: a Triton candidate file is loaded in the worker and built per shape bucket (swap_kernel),
weights and cache stay, the group runs alone on the controller's inputs (bf16 on the wire), the quality
gate passes for an honest candidate and fails for a wrong one, and the fast tier times the group.
Graph capture and device-event timing need a GPU: `tests/backends/cuda` covers them there."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from polymorph.engine.controller import Controller
from polymorph.pipeline.kernel_files import kernels_root

pytest.importorskip("triton")
pytestmark = pytest.mark.slow

GROUP = "layers.0.mlp.down+residual"


@pytest.fixture(scope="module")
def engine():
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")  # the worker inherits it: its Triton kernels run interpreted
    e = Controller.start("llama-tiny", "cuda", "h200", batch=1, ctx=32, dtype="bf16", budget_s=300)
    yield e
    e.close()
    mp.undo()


def test_a_triton_candidate_swaps_in_without_reloading_and_passes_quality(
    engine: Controller, tmp_path: Path
) -> None:
    before = engine.status()
    src = tmp_path / "linear_residual_candidate.py"
    shutil.copy(kernels_root() / "triton" / "linear_residual.py", src)
    swap = engine.swap(GROUP, src, None)
    assert swap.ok, swap.fault
    gate = engine.verify(GROUP, decode_steps=2)
    assert gate.ok, gate.first_failure()
    status = engine.status()
    assert status["groups"][GROUP]["candidate"]
    assert status["weight_loads"] == before["weight_loads"] == 1
    assert status["cache_allocations"] == before["cache_allocations"] == 1
    fast = engine.measure("fast", trials=2, group=GROUP)
    assert fast["groups"][GROUP]["median_s"] > 0
    engine.restore(GROUP)
    assert not engine.status()["groups"][GROUP]["candidate"]


def test_a_wrong_triton_candidate_fails_the_quality_gate(engine: Controller, tmp_path: Path) -> None:
    text = (kernels_root() / "triton" / "linear_residual.py").read_text()
    # The epilogue adds the residual twice: a plausible bug, numerically far off.
    wrong, n = re.subn(r"_to\(r \+ proj, dtype\)", "_to(r + r + proj, dtype)", text, count=1)
    if n == 0:
        pytest.skip("linear_residual.py no longer has the `r + proj` epilogue this test edits")
    src = tmp_path / "linear_residual_wrong.py"
    src.write_text(wrong)
    assert engine.swap(GROUP, src, None).ok
    gate = engine.verify(GROUP, decode_steps=2)
    assert not gate.ok
    assert not engine.status()["groups"][GROUP]["candidate"]  # the stock kernel is back


def test_run_group_carries_bf16_both_ways(engine: Controller) -> None:
    import ml_dtypes
    import numpy as np

    from polymorph.ir.shapes import concrete
    from polymorph.models import load_model

    graph = load_model("llama-tiny", dtype="bf16").graph
    types = graph.types()
    group = next(g for g in engine.loaded["groups"] if g["id"] == GROUP)
    bindings = {"batch": 1, "seq": 3}
    rng = np.random.default_rng()
    inputs = [
        None if v in graph.params
        else rng.standard_normal(concrete(types[v].shape, bindings)).astype(ml_dtypes.bfloat16)
        for v in group["inputs"]
    ]  # fmt: skip
    assert any(a is not None for a in inputs) and any(a is None for a in inputs)
    done = engine.run_calls(engine.group_info(GROUP), [inputs], bindings, stock=True)
    (out,) = done.output(0)
    assert out.dtype == ml_dtypes.bfloat16 and out.shape == (1, 3, 64)
    assert np.isfinite(out.astype(np.float32)).all()
