"""Models beyond LLMs through torch.export: each built at test time with random weights, imported,
and run on the reference, cpu and neuron (XLA on the CPU) engines; every output must be within the
f32 model tolerance of PyTorch eager on the same fresh inputs."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest
import torch

from polymorph.frontend import from_torch
from polymorph.frontend.tensors import run_on
from polymorph.ir import reference
from polymorph.ir.dtypes import DType
from polymorph.verify.tolerance import compare, model_tolerance

MODELS = ("fno", "neuralop_fno", "conv", "gnn", "esm", "patchtst", "llama")
ENGINES = ("reference", "cpu", "neuron")
_IMPORTED: dict[str, Any] = {}


def imported(zoo: Any, name: str) -> tuple[Any, Any, tuple[torch.Tensor, ...]]:
    """(eager module, imported model, example inputs), built once per session."""
    if name == "neuralop_fno" and importlib.util.find_spec("neuralop") is None:
        pytest.skip("neuraloperator is not installed (pip install neuraloperator)")
    if name in ("esm", "patchtst", "llama") and importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    if name not in _IMPORTED:
        torch.manual_seed(1234)
        module, example = zoo.MODELS[name]()
        _IMPORTED[name] = (module, from_torch(module, example), example)
    return _IMPORTED[name]


def fresh_inputs(
    name: str, example: tuple[torch.Tensor, ...], rng: np.random.Generator
) -> list[torch.Tensor]:
    """New random inputs of the example's kinds: floats normal; integer ids in the example's range."""
    out = []
    for t in example:
        if t.is_floating_point():
            out.append(torch.from_numpy(rng.standard_normal(tuple(t.shape)).astype(np.float32)))
        else:
            lo, hi = int(t.min()), int(t.max()) + 1
            out.append(torch.from_numpy(rng.integers(lo, hi, tuple(t.shape))).to(t.dtype))
    return out


def eager(module: Any, args: list[torch.Tensor]) -> list[np.ndarray]:
    import torch.utils._pytree as pytree

    with torch.no_grad():
        result = module(*args)
    return [t.numpy() for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", MODELS)
def test_model_matches_eager(zoo: Any, name: str, engine: str) -> None:
    module, model, example = imported(zoo, name)
    rng = np.random.default_rng()
    args = fresh_inputs(name, example, rng)
    inputs = {n: a.numpy() for n, a in zip(model.input_names, args, strict=True)}
    want = eager(module, args)
    if engine == "reference":
        got = reference.run(model.graph, model.weights(), inputs, {})
    else:
        got = run_on(model, inputs, engine)
    assert len(got) == len(want) == len(model.graph.outputs)
    for i, expected in enumerate(want):
        actual = got[f"output_{i}"]
        assert actual.shape == expected.shape, f"{name} on {engine}: output_{i}"
        result = compare(actual.astype(np.float32), expected, model_tolerance(DType.F32))
        assert result.ok, f"{name} on {engine}: output_{i}: {result}"


def test_weights_are_named_by_module_path(zoo: Any) -> None:
    module, model, _ = imported(zoo, "conv")
    state = module.state_dict()
    for name, tensor in state.items():
        if name.endswith("num_batches_tracked"):
            continue
        assert name in model.graph.params, f"weight {name} is not a param of the graph"
        np.testing.assert_array_equal(model.weights()[name], tensor.numpy())


def test_every_kind_of_group_has_a_kernel_file(zoo: Any) -> None:
    """The general ops lower onto kernels/torch/general.py and kernels/xla/general.py, one group each."""
    from polymorph import api

    _, model, _ = imported(zoo, "fno")
    for backend, library in (("cpu", "torch/general.py"), ("neuron", "xla/general.py")):
        plan = api.compile(model, backend).plan
        files = {g.kernel.file for g in plan.groups}
        assert library in files, f"{backend}: {sorted(files)}"
        ops = {g.pattern for g in plan.groups if g.kernel.file == library}
        assert {"conv", "fft_r2c", "fft_c2r", "cmatmul", "slice_scatter"} <= ops


def test_unknown_op_is_refused_by_name() -> None:
    from polymorph.errors import UserError

    class Atan2(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.atan2(x, y) + 1

    with pytest.raises(UserError, match=r"ATen op `aten\.atan2\.default` \(node `atan2`\)"):
        from_torch(Atan2(), (torch.randn(3), torch.randn(3)))


def test_dtype_option_casts_the_program() -> None:
    class Small(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.lin(x))

    m = Small().eval()
    x = torch.randn(3, 8)
    model = from_torch(m, (x,), dtype="bf16")
    assert model.graph.inputs["x"].dtype == DType.BF16
    assert model.weights()["lin.weight"].dtype == DType.BF16.numpy
    got = run_on(model, {"x": x.numpy().astype(DType.BF16.numpy)}, "cpu")["output_0"]
    with torch.no_grad():
        want = m(x).numpy()
    assert compare(got.astype(np.float32), want, model_tolerance(DType.BF16)).ok
