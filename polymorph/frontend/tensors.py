"""Tensors in, tensors out: an imported program run on a backend, and checked against PyTorch.

What `polymorph run FILE.pt2 --inputs IN.npz --outputs OUT.npz` and `polymorph verify FILE.pt2` do
(the CLI's side is polymorph/cli/tensors.py): inputs by position (`arr_0`, `arr_1`, ..., as
`numpy.savez` names them) or by the program's input names; outputs `output_0`, `output_1`, ... in
the program's flattened output order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from polymorph.errors import UserError
from polymorph.frontend.torch_export import ExportedModel
from polymorph.ir.dtypes import DType
from polymorph.verify.tolerance import Comparison, Tolerance, compare, model_tolerance


def bind_program(
    model: ExportedModel, arrays: Mapping[str, np.ndarray]
) -> tuple[ExportedModel, dict[str, np.ndarray]]:
    """`model` at the shapes of `arrays` (a program with dynamic dims is imported at them: UserError in
    one line when they are outside its declared ranges), and `arrays` bound as `bind_inputs` does."""
    if model.dims:
        named = _by_name(model, arrays)
        model = model.at({n: np.shape(a) for n, a in named.items()})
    return model, bind_inputs(model, arrays)


def bind_inputs(model: ExportedModel, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`arrays` (arr_0.. by position, or by input name) as the graph's inputs, each in its declared
    dtype (a float array of another width is converted, so is an integer one whose values fit; any
    other mismatch is refused)."""
    by_name = _by_name(model, arrays)
    out = {}
    for name in model.input_names:
        t = model.graph.inputs[name]
        arr = np.asarray(by_name[name])
        want = tuple(int(d) for d in t.shape)
        if tuple(arr.shape) != want:
            raise UserError(f"input `{name}` has shape {list(arr.shape)}; the program takes {t}")
        out[name] = _as_dtype(name, arr, t.dtype)
    return out


def _by_name(model: ExportedModel, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = list(model.input_names)
    keys = list(arrays)
    positional = [f"arr_{i}" for i in range(len(keys))]
    if keys and sorted(keys) == sorted(positional):
        by_name = {names[i]: arrays[f"arr_{i}"] for i in range(min(len(keys), len(names)))}
        given = len(keys)
    else:
        unknown = [k for k in keys if k not in names]
        if unknown:
            raise UserError(
                f"input `{unknown[0]}` is not an input of `{model.name}`; its inputs are "
                f"{', '.join(names)} (or give them by position: arr_0, arr_1, ...)"
            )
        by_name = dict(arrays)
        given = len(by_name)
    if given != len(names) or set(by_name) != set(names):
        raise UserError(f"`{model.name}` takes {len(names)} input(s) ({', '.join(names)}), {given} given")
    return by_name


def _as_dtype(name: str, arr: np.ndarray, dtype: DType) -> np.ndarray:
    if arr.dtype == dtype.numpy:
        return arr
    kind = arr.dtype.kind
    if dtype.is_float and kind in "fV":
        return arr.astype(np.float32).astype(dtype.numpy)
    if dtype.is_int and kind in "iu":
        info = np.iinfo(dtype.numpy)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise UserError(f"input `{name}` has values outside {dtype}")
        return arr.astype(dtype.numpy)
    raise UserError(f"input `{name}` is {arr.dtype}; the program takes {dtype}")


def run_on(
    model: ExportedModel, inputs: Mapping[str, np.ndarray], backend: str | None = None
) -> dict[str, np.ndarray]:
    """The model compiled for `backend` (default: POLYMORPH_BACKEND or cpu) and run once."""
    from polymorph import api
    from polymorph.pipeline.backend import registry

    artifact = api.compile(model, backend)
    exe = registry.get(artifact.plan.backend).load(artifact, model.weights())
    return exe.run(dict(inputs))


@dataclass(frozen=True)
class OutputCheck:
    name: str
    comparison: Comparison
    tolerance: Tolerance


def verify_program(
    model: ExportedModel,
    backend: str | None = None,
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    seed: int | None = None,
) -> list[OutputCheck]:
    """Each output of the model on `backend` against the program run by PyTorch, on `inputs` (bound
    as `bind_program` does: a dynamic program at their shapes) or on fresh random ones, at the model
    tolerance of the output's dtype."""
    if inputs is None:
        seed = int(np.random.default_rng().integers(2**31)) if seed is None else seed
        inputs = model.example_inputs(seed)
    model, bound = bind_program(model, inputs)
    got = run_on(model, bound, backend)
    want = model.run_program(bound)
    checks = []
    for name in model.graph.outputs:
        dtype = model.graph.types()[model.graph.outputs[name]].dtype
        tol = model_tolerance(dtype) if dtype != DType.C64 else model_tolerance(DType.F32)
        actual, expected = got[name], want[name]
        if np.iscomplexobj(expected):  # compared as (real, imaginary) pairs
            actual, expected = np.stack([actual.real, actual.imag]), np.stack([expected.real, expected.imag])
        elif expected.dtype.kind in "biu":
            actual, expected = actual.astype(np.float64), expected.astype(np.float64)
        else:
            actual = actual.astype(np.float32)
        checks.append(OutputCheck(name, compare(actual, expected, tol), tol))
    return checks
