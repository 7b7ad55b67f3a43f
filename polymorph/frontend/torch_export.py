"""torch.export programs into IR graphs: `from_torch(module, example_inputs)` and `.pt2` files.

The program is decomposed to core ATen (`run_decompositions()`), then walked node by node; each ATen
op becomes general or model-level IR ops (polymorph/frontend/aten.py). Parameters and buffers become
params under their module paths (`enc1.weight`), with their values as the model's weights; the user
inputs become graph inputs under the program's names; the outputs are `output_0`, `output_1`, ... in
the program's flattened order. A value that depends on no input and no weight (an `arange`, a mask, a
zero-filled buffer) is computed once here by PyTorch and kept as a constant param (`const.<node>`).

Shapes are the example inputs' (the IR graph is static); a program exported with dynamic dims is
imported at its example shapes only when asked (`static=True`), else refused with the reason.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polymorph.errors import UserError
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import Graph
from polymorph.models.zoo import Model


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch.export's own chatter kept off a one-line CLI error: its deprecation warnings (pytree
    LeafSpec) and the traceback its loader logs before it re-raises on a file that is not a program."""
    import logging

    logger = logging.getLogger("torch.export")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        logger.setLevel(level)


@dataclass
class ExportedModel(Model):
    """A model imported from a torch.export program: its graph, its weights, and the program itself
    (the oracle `verify` compares against)."""

    program: Any = field(default=None, repr=False)
    input_names: tuple[str, ...] = ()

    def example_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Fresh random inputs of the graph's types: floats normal, integers in [0, 8), bools random
        (an integer input that indexes something needs the caller's own values)."""
        rng = np.random.default_rng(seed)
        out = {}
        for name, t in self.graph.inputs.items():
            shape = tuple(int(d) for d in t.shape)
            if t.dtype.is_float:
                out[name] = rng.standard_normal(shape).astype(t.dtype.numpy)
            elif t.dtype == DType.BOOL:
                out[name] = rng.random(shape) < 0.5
            else:
                out[name] = rng.integers(0, 8, shape).astype(t.dtype.numpy)
        return out

    def run_program(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The program run by PyTorch itself on `inputs` (by graph input name): outputs by name."""
        import torch

        args = []
        for n in self.input_names:
            arr = np.asarray(inputs[n])
            if DType.of(arr).is_float and arr.dtype != np.float32:  # a --dtype model: the program is f32
                arr = arr.astype(np.float32)
            args.append(torch.from_numpy(np.ascontiguousarray(arr).reshape(arr.shape)))
        with torch.no_grad():
            result = self.program.module()(*args)
        flat = flatten_outputs(result)
        return {f"output_{i}": t.detach().numpy().copy() for i, t in enumerate(flat)}


def flatten_outputs(result: Any) -> list[Any]:
    import torch
    import torch.utils._pytree as pytree

    leaves = pytree.tree_leaves(result)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def from_torch(
    module: Any,
    example_inputs: Sequence[Any],
    dynamic_shapes: Any = None,
    *,
    name: str | None = None,
    static: bool = False,
    dtype: str | DType | None = None,
) -> ExportedModel:
    """Export `module` with torch.export (non-strict) at `example_inputs` and import the program."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise UserError(f"from_torch takes a torch.nn.Module, got {type(module).__name__}")
    module = module.eval()
    try:
        with _quiet():
            program = torch.export.export(
                module, tuple(example_inputs), dynamic_shapes=dynamic_shapes, strict=False
            )
    except Exception as e:  # torch.export's own diagnosis, in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"torch.export could not export {type(module).__name__}: {first}") from None
    return from_program(program, name=name or type(module).__name__, static=static, dtype=dtype)


def load_pt2(path: str | Path, *, static: bool = False, dtype: str | DType | None = None) -> ExportedModel:
    """A file `torch.export.save` wrote."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise UserError(f"no such file: {path}; give a .pt2 file written by torch.export.save")
    try:
        with _quiet():
            program = torch.export.load(str(path))
    except Exception as e:
        raise UserError(f"{path}: not a torch.export program ({type(e).__name__}: {str(e)[:200]})") from None
    model = from_program(program, name=path.stem, static=static, dtype=dtype)
    model.source = str(path.resolve())
    return model


def from_program(
    program: Any, *, name: str = "exported", static: bool = False, dtype: str | DType | None = None
) -> ExportedModel:
    """An ExportedProgram (any dialect) as an ExportedModel: core ATen decompositions, then import.
    `dtype`: every float32 value of the program (weights, inputs, intermediates) becomes this dtype;
    None keeps the program's own dtypes."""
    from polymorph.frontend.aten import Importer

    try:
        float_dtype = (
            None if dtype is None else dtype if isinstance(dtype, DType) else DType.parse(str(dtype))
        )
    except ValueError as e:
        raise UserError(f"--dtype: {e}") from None
    if float_dtype is not None and not float_dtype.is_float:
        raise UserError(f"--dtype must be a float dtype, got {float_dtype}")

    try:
        with _quiet():
            decomposed = program.run_decompositions()
    except Exception as e:
        raise UserError(f"the core ATen decompositions failed on `{name}`: {type(e).__name__}: {e}") from None
    importer = Importer(
        decomposed, name, static=static, dtype=None if float_dtype == DType.F32 else float_dtype
    )
    graph: Graph = importer.run()
    from polymorph.ir.spec import verify

    verify(graph)
    return ExportedModel(
        name=name,
        graph=graph,
        source=name,
        _weights=importer.weights,
        program=program,
        input_names=tuple(importer.input_names),
    )
