"""Compile the whole Llama-3.2-1B decode plan for every GPU target without a GPU (Triton AOT), and
hold the plan to the bar: device code for every kernel, resources stated, nothing spilled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polymorph import api
from polymorph.models import load_model

pytest.importorskip("triton")

TARGETS = [("cuda", "h200", "cuda:sm_90"), ("cuda", "b200", "cuda:sm_100"),
           ("rocm", "mi300x", "rocm:gfx942"), ("rocm", "mi355x", "rocm:gfx950")]  # fmt: skip


@pytest.fixture(scope="module")
def llama_1b():
    return load_model("llama-3.2-1b", dtype="bf16")


@pytest.mark.parametrize(("backend", "chip", "target"), TARGETS, ids=[t[2] for t in TARGETS])
def test_decode_plan_compiles_without_spills(
    llama_1b, tmp_path: Path, backend: str, chip: str, target: str
) -> None:
    artifact = api.compile(llama_1b, backend, chip, tmp_path, batch=1, ctx=1024)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["target"] == target and report["schema_version"] == 1
    assert len(report["kernels"]) == len(artifact.plan.groups)
    own = [k for k in report["kernels"] if k["library"] is None]
    assert own, "every kernel a library call?"
    register = "registers" if backend == "cuda" else "vgprs"
    for k in own:
        res = k["resources"]
        assert res.get(register), f"{k['group']}: no {register} in {res}"
        assert res.get("spill_bytes") == 0, f"{k['group']} spills {res.get('spill_bytes')} bytes on {target}"
        assert k["predicted_s"] and k["predicted_s"] > 0
    code = {".cubin", ".ptx"} if backend == "cuda" else {".hsaco", ".amdgcn"}
    written = {Path(f).suffix for f in artifact.files}
    assert code <= written
    assert report["predicted_step_s"] > 0
    assert not report["warnings"]


def test_sm_103_is_attempted_and_reported(llama_1b, tmp_path: Path) -> None:
    """GB300 (sm_103): compiled where the installed Triton knows the arch, else a clear error."""
    from polymorph.errors import UserError

    try:
        artifact = api.compile(llama_1b, "cuda", "gb300", tmp_path, batch=1, ctx=1024)
    except UserError as e:
        assert "sm_103" in str(e) or "gb300" in str(e)
        return
    assert artifact.plan.target == "cuda:sm_103"
    assert any(f.endswith(".cubin") for f in artifact.files)
