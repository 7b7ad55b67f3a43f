"""Programmatic dependent launch in the deviceless sm_90 decode plan of Llama-3.2-1B: every kernel of
the files that take it (decode attention, the projections) carries griddepcontrol.wait and
launch_dependents in its PTX, with no global load before the wait (a PDL kernel may start while its
predecessor still writes), and the gfx942 plan, whose profile takes no PDL, carries none."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polymorph import api
from polymorph.hardware.target import Target
from polymorph.hardware.traits import traits_for
from polymorph.models import load_model
from polymorph.verify.triton_interpreter import process_interprets

pytest.importorskip("triton")

PDL_FILES = ("decode_attention", "linear", "linear_residual", "rmsnorm_linear", "rmsnorm_swiglu",
             "rmsnorm_qkv_rope")  # fmt: skip


def test_pdl_traits() -> None:
    assert traits_for(Target.parse("cuda:sm_90")).programmatic_dependent_launch
    assert traits_for(Target.parse("cuda:sm_100")).programmatic_dependent_launch
    assert not traits_for(Target.parse("rocm:gfx942")).programmatic_dependent_launch


def test_sm90_decode_plan_waits_before_reading(tmp_path: Path) -> None:
    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; AOT compilation needs compiled kernels")
    model = load_model("llama-3.2-1b", dtype="bf16")
    artifact = api.compile(model, "cuda", "h200", tmp_path, batch=1, ctx=1024)
    ptx = {Path(f).name: Path(f) for f in artifact.files if f.endswith(".ptx")}
    checked = set()
    for name, path in ptx.items():
        text = path.read_text() if path.is_absolute() else (tmp_path / path).read_text()
        file = name.split("-")[0]
        if file not in PDL_FILES:
            assert "griddepcontrol" not in text, f"{name}: griddepcontrol in a kernel launched without PDL"
            continue
        checked.add(file)
        assert text.count("griddepcontrol.wait") >= 1, f"{name}: no griddepcontrol.wait"
        assert "griddepcontrol.launch_dependents" in text, f"{name}: no griddepcontrol.launch_dependents"
        before = text[: text.index("griddepcontrol.wait")]
        assert not re.search(r"\bld\.global", before), f"{name}: a global load before griddepcontrol.wait"
    assert {"decode_attention", "rmsnorm_qkv_rope", "linear_residual", "rmsnorm_swiglu"} <= checked, checked


def test_gfx942_decode_plan_has_no_pdl(tmp_path: Path) -> None:
    if process_interprets():
        pytest.skip("triton was imported under TRITON_INTERPRET=1; AOT compilation needs compiled kernels")
    model = load_model("llama-3.2-1b", dtype="bf16")
    artifact = api.compile(model, "rocm", "mi300x", tmp_path, batch=1, ctx=1024)
    for f in artifact.files:
        if f.endswith(".amdgcn"):
            path = Path(f) if Path(f).is_absolute() else tmp_path / f
            assert "griddepcontrol" not in path.read_text(), f
