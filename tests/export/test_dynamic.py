"""Programs exported with dynamic dims: imported static at each size asked for, within the ranges
torch.export declared. A model with a dynamic batch and a dynamic length runs at its buckets (the
example's shapes, every dim at its min, every dim at its max) on cpu and neuron, within the f32 model
tolerance of PyTorch eager on fresh inputs; `polymorph run` takes any shape in range and refuses one
outside it in one line (exit 2); an unbounded max is clamped for the buckets and said so; an engine
loads a program at a bucket (`FILE.pt2@shape-...`) and gates a group there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from polymorph.cli.command import main
from polymorph.errors import UserError
from polymorph.frontend import from_torch, load_pt2
from polymorph.frontend.tensors import run_on
from polymorph.ir.dtypes import DType
from polymorph.verify.tolerance import compare, model_tolerance

EXAMPLE = (3, 5)  # (batch, length) of the example input
RANGES = {"batch": (2, 6), "length": (2, 12)}


class Sequence(nn.Module):
    """[B, L, 8] -> ([B, 8], [B, L * 8]): a constant of the length's size (positions), a norm, a mean
    over the length and a flatten (a derived dim, L * 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(x.shape[1], dtype=x.dtype)[None, :, None] / 10.0  # [1, L, 1]
        h = self.norm(self.proj(x) + pos)  # [B, L, 8]
        return h.mean(dim=1), h.reshape(x.shape[0], -1)


def _dims(unbounded: bool = False) -> dict[str, Any]:
    batch = torch.export.Dim("batch", min=RANGES["batch"][0], max=RANGES["batch"][1])
    length = (
        torch.export.Dim("length", min=2)
        if unbounded
        else torch.export.Dim("length", min=RANGES["length"][0], max=RANGES["length"][1])
    )
    return {"x": {0: batch, 1: length}}


@pytest.fixture(scope="module")
def module() -> nn.Module:
    torch.manual_seed(5)
    return Sequence().eval()


@pytest.fixture(scope="module")
def model(module: nn.Module) -> Any:
    return from_torch(module, (torch.randn(*EXAMPLE, 8),), dynamic_shapes=_dims())


@pytest.fixture(scope="module")
def pt2(module: nn.Module, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "seq.pt2"
    program = torch.export.export(module, (torch.randn(*EXAMPLE, 8),), dynamic_shapes=_dims(), strict=False)
    torch.export.save(program, str(path))
    return path


def _eager(module: nn.Module, x: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        return [t.numpy() for t in module(torch.from_numpy(x))]


def test_buckets_are_the_example_the_mins_and_the_maxes(model: Any) -> None:
    shapes = [model.at_sizes(s).input_shapes()["x"] for s in model.bucket_sizes()]
    assert shapes == [(*EXAMPLE, 8), (2, 2, 8), (6, 12, 8)]
    assert model.at_sizes(model.bucket_sizes()[0]) is model  # the example's graph is the one imported


@pytest.mark.parametrize("engine", ["cpu", "neuron"])
def test_runs_at_every_bucket_like_eager(model: Any, module: nn.Module, engine: str) -> None:
    seed = int(np.random.default_rng().integers(2**31))
    rng = np.random.default_rng(seed)
    tol = model_tolerance(DType.F32)
    for sizes in model.bucket_sizes():
        at = model.at_sizes(sizes)
        x = rng.standard_normal(at.input_shapes()["x"]).astype(np.float32)
        got = run_on(at, {"x": x}, engine)
        for i, want in enumerate(_eager(module, x)):
            c = compare(got[f"output_{i}"], want, tol)
            assert c.ok, f"{engine} at {x.shape}: output_{i}: {c} (seed {seed})"


def test_run_cli_takes_any_shape_in_range(pt2: Path, module: nn.Module, tmp_path: Path, capsys: Any) -> None:
    x = np.random.default_rng().standard_normal((4, 7, 8)).astype(np.float32)  # no bucket's shape
    np.savez(tmp_path / "in.npz", x)
    assert main(["run", str(pt2), "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "out.npz"),
                 "--backend", "cpu"]) == 0  # fmt: skip
    with np.load(tmp_path / "out.npz") as got:
        for i, want in enumerate(_eager(module, x)):
            c = compare(got[f"output_{i}"], want, model_tolerance(DType.F32))
            assert c.ok, f"output_{i}: {c}"


@pytest.mark.parametrize("shape", [(7, 5, 8), (3, 13, 8), (3, 1, 8), (3, 5, 9)])
def test_run_cli_refuses_a_shape_out_of_range_in_one_line(
    pt2: Path, tmp_path: Path, capsys: Any, shape: tuple[int, ...]
) -> None:
    np.savez(tmp_path / "in.npz", np.zeros(shape, dtype=np.float32))
    code = main(["run", str(pt2), "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "o.npz")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"has shape {list(shape)}" in err and "Traceback" not in err, err
    assert not (tmp_path / "o.npz").exists()


def test_bucket_spec_and_its_range(pt2: Path) -> None:
    top = load_pt2(f"{pt2}@shape-6x12x8")
    assert top.input_shapes() == {"x": (6, 12, 8)} and top.source.endswith("@shape-6x12x8")
    with pytest.raises(UserError, match="outside the program's declared range"):
        load_pt2(f"{pt2}@shape-6x13x8")


def test_an_unbounded_max_is_clamped_and_said(module: nn.Module, tmp_path: Path, capsys: Any) -> None:
    from polymorph.frontend.torch_export import UNBOUNDED_FACTOR
    from polymorph.search.tune import program_buckets

    path = tmp_path / "open.pt2"
    program = torch.export.export(
        module, (torch.randn(*EXAMPLE, 8),), dynamic_shapes=_dims(unbounded=True), strict=False
    )
    torch.export.save(program, str(path))
    buckets = program_buckets(str(path), None, None, None)
    top = UNBOUNDED_FACTOR * EXAMPLE[1]
    assert [b.id for b in buckets] == ["shape-3x5x8", "shape-2x2x8", f"shape-6x{top}x8"]
    assert [b.model for b in buckets] == [str(path), f"{path}@shape-2x2x8", f"{path}@shape-6x{top}x8"]
    out = capsys.readouterr().out
    assert f"has no declared max: gated up to {top}" in out, out


def test_an_engine_gates_at_a_bucket(pt2: Path) -> None:
    from polymorph.engine.controller import Controller
    from polymorph.engine.gates import NUMERICS

    with Controller.start(f"{pt2}@shape-6x12x8", "cpu") as engine:
        assert engine.program
        assert tuple(engine.graph.inputs["x"].shape) == (6, 12, 8)
        group = next(g for g in engine.loaded["groups"] if g["pattern"] == "layernorm")
        _, report = engine.try_candidate(group["id"], f"kernels/{group['kernel']}", {})  # its stock kernel
        assert report is not None and report.ok, [(g.name, g.verdict, g.cause) for g in report.gates]
        assert report.gate(NUMERICS).verdict == "pass"


def test_tune_runs_every_bucket_at_its_shapes(pt2: Path, tmp_path: Path) -> None:
    """A short tune (no time to measure: what is checked is that each bucket is planned, and its
    engine loaded, at its own shapes, and each gets its own output folder)."""
    from polymorph.search.tune import TuneOptions, tune

    out = tmp_path / "tuned"
    report = tune(TuneOptions(model=str(pt2), budget_s=3.0, out=out, quiet=True))  # each: a second
    assert [b.bucket for b in report.buckets] == ["shape-3x5x8", "shape-2x2x8", "shape-6x12x8"]
    for b in report.buckets:  # the projection's signature at the bucket's [batch, length, 8]
        shape = b.bucket.removeprefix("shape-").replace("x", ",")
        assert any(s.signature.startswith(f"linear(f32[{shape}]") for s in b.signatures), b.signatures
    assert (out / "plan.json").exists() and (out / "shape-6x12x8" / "plan.json").exists()


def test_engine_start_names_the_buckets(pt2: Path) -> None:
    from polymorph.cli.tensors import buckets_note

    note = buckets_note(f"{pt2}@shape-2x2x8")
    assert note is not None and "shape-3x5x8, shape-2x2x8, shape-6x12x8" in note, note
    assert f"engine start {pt2}@shape-6x12x8" in note
