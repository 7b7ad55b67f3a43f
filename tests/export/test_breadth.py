"""Breadth: small models of many layer kinds (tests/export/breadth_zoo.py: ResNet with BatchNorm, UNet
with ConvTranspose2d, dilated/depthwise 1-d convs, 3-d convs, transformer encoder and decoder layers,
MultiheadAttention, SDPA, activations, reductions, gather/scatter/index ops, FFT with complex weights
and arithmetic, pooling and padding modes, norms, GRU/LSTM, integer and bool flows, dict and tuple
outputs), each saved with torch.export.save and run by `polymorph run FILE.pt2 --inputs --outputs` on
cpu and neuron against PyTorch eager on fresh random inputs (integers drawn from their legal ranges)
at the f32 model tolerance; and ops outside the general op set refused by name in one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

from polymorph.cli.command import main
from polymorph.errors import UserError
from polymorph.frontend import from_torch
from polymorph.frontend.tensors import run_on
from polymorph.frontend.torch_export import load_pt2
from polymorph.ir.dtypes import DType
from polymorph.verify.tolerance import compare, model_tolerance


def _breadth_zoo() -> ModuleType:
    # --import-mode=importlib: a sibling module is loaded by path
    spec = importlib.util.spec_from_file_location("breadth_zoo", Path(__file__).with_name("breadth_zoo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ZOO = _breadth_zoo()


def _fresh(name: str, example: tuple[torch.Tensor, ...], rng: np.random.Generator) -> list[torch.Tensor]:
    out = []
    for i, t in enumerate(example):
        if t.is_floating_point():
            out.append(torch.from_numpy(rng.standard_normal(tuple(t.shape)).astype(np.float32)))
        elif t.dtype == torch.bool:
            out.append(torch.from_numpy(rng.random(tuple(t.shape)) < 0.5))
        else:
            lo, hi = ZOO.INT_RANGES[(name, i)]
            out.append(torch.from_numpy(rng.integers(lo, hi, tuple(t.shape))).to(t.dtype))
    return out


def _saved(name: str, tmp_path: Path) -> tuple[Any, tuple[torch.Tensor, ...], Path, list[str]]:
    """The model built (seeded by name), exported and saved: (module, example, .pt2 path, input names)."""
    torch.manual_seed(sum(map(ord, name)))
    module, example = ZOO.MODELS[name]()
    module = module.eval()
    path = tmp_path / f"{name}.pt2"
    program = torch.export.export(module, example, strict=False)
    torch.export.save(program, str(path))
    names = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    return module, example, path, names


def _check(name: str, where: str, got: dict[str, np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want), f"{name} on {where}: {sorted(got)}"
    for i, expected in enumerate(want):
        actual = np.asarray(got[f"output_{i}"])
        exact = expected.dtype.kind in "biu"  # integers and bools must match exactly
        tol = model_tolerance(DType.I64 if exact else DType.F32)
        result = compare(actual.astype(expected.dtype), expected, tol)
        assert result.ok, f"{name} on {where}: output_{i}: {result}"


def _eager(module: Any, args: list[torch.Tensor]) -> list[np.ndarray]:
    with torch.no_grad():
        return [t.numpy() for t in pytree.tree_leaves(module(*args)) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("name", sorted(ZOO.MODELS))
def test_pt2_matches_eager(name: str, tmp_path: Path) -> None:
    """The saved program as `polymorph run` loads it, on cpu and neuron (one import for both)."""
    module, example, path, names = _saved(name, tmp_path)
    model = load_pt2(path)
    args = _fresh(name, example, np.random.default_rng())
    want = _eager(module, args)
    inputs = {n: a.numpy() for n, a in zip(names, args, strict=True)}
    for backend in ("cpu", "neuron"):
        _check(name, backend, run_on(model, inputs, backend), want)


def test_cli_run_matches_eager(tmp_path: Path) -> None:
    """`polymorph run FILE.pt2 --inputs IN.npz --outputs OUT.npz`: int64 and int32 inputs, an integer output."""
    name = "integers"
    module, example, path, names = _saved(name, tmp_path)
    args = _fresh(name, example, np.random.default_rng())
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **{n: a.numpy() for n, a in zip(names, args, strict=True)})
    out = tmp_path / "out.npz"
    code = main(["run", str(path), "--inputs", str(inputs), "--outputs", str(out), "--backend", "neuron"])
    assert code == 0
    _check(name, "neuron (cli)", dict(np.load(out)), _eager(module, args))


class _Lambda(torch.nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


@pytest.mark.parametrize(
    ("fn", "needle"),
    [
        (lambda x: x.topk(2, dim=-1).values, r"ATen op `aten\.topk\.default` \(node `topk`\)"),
        (lambda x: x.cumprod(-1), r"ATen op `aten\.cumprod\.default` \(node `cumprod`\)"),
        (lambda x: x.scatter(1, torch.zeros(3, 2, dtype=torch.long), 1.0), r"`aten\.scatter\.value`"),
        (
            lambda x: x.index_put((torch.tensor([0, 1]),), torch.ones(2, 4)),
            r"node `index_put`: index_put without",
        ),
        (lambda x: x[x > 0], r"node `index`.*boolean-mask indexing"),
        (lambda x: torch.exp(torch.fft.fft(x)).abs(), r"node `exp` \(aten\.exp\.default\) on complex values"),
        (lambda x: x.double().sum().float(), r"node `_to_copy`: dtype torch\.float64"),
    ],
    ids=["topk", "cumprod", "scatter", "index_put", "bool_mask", "complex_exp", "f64"],
)
def test_outside_the_op_set_is_refused_by_name(fn: Any, needle: str) -> None:
    with pytest.raises(UserError, match=needle) as info:
        from_torch(_Lambda(fn), (torch.randn(3, 4),))
    assert len(str(info.value).splitlines()) == 1, str(info.value)


def test_a_freed_constant_does_not_lend_its_param() -> None:
    """A converter's temporary constant tensor (a flip's reversed positions, a default norm weight)
    must become its own param even when CPython reuses a freed temporary's id for it."""
    from polymorph.frontend.aten import Importer

    imp = Importer(None, "consts")
    names = [imp.materialize(torch.arange(n - 1, -1, -1), None, "rev") for n in (3, 2, 3, 2)]
    for name, n in zip(names, (3, 2, 3, 2), strict=True):
        np.testing.assert_array_equal(imp.weights[name], np.arange(n - 1, -1, -1))
