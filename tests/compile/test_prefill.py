"""The 2k-token prefill of Llama-3.2-1B from the CLI, for every GPU target without a GPU: the large
matrix kernels (wgmma on sm_90, tcgen05 on sm_100, MFMA on gfx942/gfx950) in the device code, every
kernel's resources stated, nothing spilled."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from polymorph.cli.command import main

pytest.importorskip("triton")

TARGETS = [("cuda", "h200", "cuda:sm_90"), ("cuda", "b200", "cuda:sm_100"),
           ("rocm", "mi300x", "rocm:gfx942"), ("rocm", "mi355x", "rocm:gfx950")]  # fmt: skip
# The matrix instruction each target's prefill GEMMs must use, as it reads in the device code.
MATRIX = {
    "cuda:sm_90": re.compile(r"\bwgmma\.mma_async"),
    "cuda:sm_100": re.compile(r"\btcgen05\.mma"),
    "rocm:gfx942": re.compile(r"\bv_mfma_"),
    "rocm:gfx950": re.compile(r"\bv_mfma_"),
}


@pytest.mark.parametrize(("backend", "chip", "target"), TARGETS, ids=[t[2] for t in TARGETS])
def test_the_2k_prefill_compiles_spill_free(tmp_path: Path, backend: str, chip: str, target: str) -> None:
    out = tmp_path / "out"
    argv = ["compile", "llama-3.2-1b", "--backend", backend, "--target", chip, "--prefill", "2048"]
    assert main([*argv, "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["target"] == target
    assert report["bindings"]["seq"] == 2048 and report["bindings"]["batch"] == 1
    own = [k for k in report["kernels"] if k["library"] is None]
    assert own
    for k in own:
        res = k["resources"]
        assert res.get("spill_bytes") == 0, f"{k['group']} spills on {target}: {res}"
    text = "\n".join(p.read_text() for p in (out / "device").iterdir() if p.suffix in (".ptx", ".amdgcn"))
    assert MATRIX[target].search(text), f"no {MATRIX[target].pattern} in the {target} prefill's device code"
    assert not report["warnings"], report["warnings"]
