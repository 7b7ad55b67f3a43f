"""torch.export programs into IR graphs: `from_torch(module, example_inputs)` and `.pt2` files.

The program is decomposed to core ATen (`run_decompositions()`), then walked node by node; each ATen
op becomes general or model-level IR ops (polymorph/frontend/aten.py). Parameters and buffers become
params under their module paths (`enc1.weight`), with their values as the model's weights; the user
inputs become graph inputs under the program's names; the outputs are `output_0`, `output_1`, ... in
the program's flattened order. A value that depends on no input and no weight (an `arange`, a mask, a
zero-filled buffer) is computed once here by PyTorch and kept as a constant param (`const.<node>`).

Dynamic dims (`dynamic_shapes=`, or a .pt2 exported with them): the IR graph is static, imported at
one size per dim (`DynamicDim`), the example inputs' by default; `ExportedModel.at(shapes)` imports
the same program at other input shapes within the declared ranges (the decomposed program is kept,
so that is one walk, not an export), and refuses shapes outside them in one line. The program's
buckets (what `tune` and the engine gate at) are its example inputs' shapes plus every dynamic dim at
its min and at its max (`bucket_sizes`); a dim with no declared max is taken to UNBOUNDED_FACTOR times
its example size there, and a min of 0 or 1 is gated from 1 (an empty tensor has nothing to check).
A file spec `FILE.pt2@shape-4x3x8` (a bucket id) loads the program at that bucket's shapes.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
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


UNBOUNDED_FACTOR = 2  # the largest bucket of a dim with no declared max: this many times its example


@dataclass(frozen=True)
class DynamicDim:
    """One dynamic dim of a program: its symbol's name in the program (`s77`), the range torch.export
    declared (`hi` None: no max), and its size in the example inputs."""

    symbol: str
    lo: int
    hi: int | None
    example: int

    @property
    def gate_range(self) -> tuple[int, int]:
        """The sizes the buckets use: the declared range, from 1, with an unbounded max clamped."""
        hi = self.hi if self.hi is not None else max(UNBOUNDED_FACTOR * self.example, self.lo, 1)
        return max(self.lo, 1), hi

    def describe(self) -> str:
        return f"{self.lo} <= {self.symbol} <= {self.hi if self.hi is not None else 'inf'}"


@dataclass
class _Source:
    """What re-importing the program at other sizes needs: the decomposed program, its symbols and
    each input's dims as expressions of them."""

    decomposed: Any
    symbols: dict[str, Any]  # name -> sympy Symbol
    dims: dict[str, tuple[Any, ...]]  # input name -> each dim: an int or a sympy expression
    float_dtype: DType | None


@dataclass
class ExportedModel(Model):
    """A model imported from a torch.export program: its graph (at `sizes`), its weights, and the
    program itself (the oracle `verify` compares against)."""

    program: Any = field(default=None, repr=False)
    input_names: tuple[str, ...] = ()
    dims: tuple[DynamicDim, ...] = ()  # the program's dynamic dims; () for a static program
    sizes: dict[str, int] = field(default_factory=dict)  # each dim's size in this graph, by symbol
    _source: _Source | None = field(default=None, repr=False)

    def example_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Fresh random inputs of the graph's types: floats normal, bools random, integers from the
        range they can legally take (polymorph/ir/int_ranges.py: [0, n) for an index into a dim of n,
        else the example inputs' range, else [0, 8))."""
        from polymorph.ir.int_ranges import legal_ranges

        rng = np.random.default_rng(seed)
        ranges = legal_ranges(self.graph)
        out = {}
        for name, t in self.graph.inputs.items():
            shape = tuple(int(d) for d in t.shape)
            if t.dtype.is_float:
                out[name] = rng.standard_normal(shape).astype(t.dtype.numpy)
            elif t.dtype == DType.BOOL:
                out[name] = rng.random(shape) < 0.5
            else:
                lo, hi = ranges.get(name, (0, 8))
                out[name] = rng.integers(lo, hi, shape).astype(t.dtype.numpy)
        return out

    # --- dynamic dims -----------------------------------------------------------------------------------

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: tuple(int(d) for d in self.graph.inputs[n].shape) for n in self.input_names}

    def bucket_sizes(self) -> list[dict[str, int]]:
        """The sizes of the program's buckets: the example's, every dim at its min, every dim at its
        max (`DynamicDim.gate_range`), duplicates dropped. A static program has the example's only."""
        example = {d.symbol: d.example for d in self.dims}
        low = {d.symbol: d.gate_range[0] for d in self.dims}
        high = {d.symbol: d.gate_range[1] for d in self.dims}
        out: list[dict[str, int]] = []
        for sizes in (example, low, high):
            if sizes not in out:
                out.append(sizes)
        return out

    def clamped(self) -> list[DynamicDim]:
        """The dims whose largest bucket is not a declared max (UNBOUNDED_FACTOR times the example)."""
        return [d for d in self.dims if d.hi is None]

    def at_sizes(self, sizes: Mapping[str, int]) -> ExportedModel:
        """The same program imported with its dims at `sizes` (by symbol name); self when they are
        this graph's. UserError when a size is outside its dim's declared range."""
        sizes = {k: int(v) for k, v in sizes.items()}
        if sizes == self.sizes or not self.dims:
            return self
        for d in self.dims:
            n = sizes[d.symbol]
            if n < d.lo or (d.hi is not None and n > d.hi) or n < 1:
                raise UserError(
                    f"`{self.name}`: {d.symbol} = {n} is outside the program's declared range "
                    f"{d.describe()}{' (and sizes start at 1)' if n < 1 else ''}; {self._takes()}"
                )
        src = self._source
        assert src is not None
        graph, weights, names = _import(
            src.decomposed, self.name, {src.symbols[k]: v for k, v in sizes.items()}, src.float_dtype
        )
        _record_int_ranges(graph, self.program, names)
        return replace(self, graph=graph, _weights=weights, input_names=names, sizes=sizes)

    def at(self, shapes: Mapping[str, Sequence[int]]) -> ExportedModel:
        """The program at these input shapes (by input name): each dynamic dim's size read off them,
        checked against its declared range and against every other dim. UserError in one line when the
        shapes do not fit the program."""
        if not self.dims:
            return self
        src = self._source
        assert src is not None
        sizes: dict[str, int] = {}
        pending: list[tuple[str, Any, int]] = []
        for name in self.input_names:
            got = tuple(int(d) for d in shapes[name])
            want = src.dims[name]
            if len(got) != len(want):
                raise UserError(f"input `{name}` has shape {list(got)}; {self._takes()}")
            for expr, n in zip(want, got, strict=True):
                if isinstance(expr, int):
                    if expr != n:
                        raise UserError(f"input `{name}` has shape {list(got)}; {self._takes()}")
                elif expr.is_Symbol:
                    d = next(d for d in self.dims if d.symbol == str(expr))
                    if n < max(d.lo, 1) or (d.hi is not None and n > d.hi):
                        axis = want.index(expr)
                        raise UserError(
                            f"input `{name}` has shape {list(got)}: dim {axis} ({expr}) is {n}, outside "
                            f"the program's declared range {d.describe()}; {self._takes()}"
                        )
                    if sizes.setdefault(str(expr), n) != n:
                        raise UserError(
                            f"input `{name}` has shape {list(got)}: dim {expr} is {sizes[str(expr)]} in "
                            f"another input; {self._takes()}"
                        )
                else:
                    pending.append((name, expr, n))
        for name, expr, n in pending:  # a derived dim (2*s0): solved for its one unknown, then checked
            import sympy

            unknown = [s for s in expr.free_symbols if str(s) not in sizes]
            if len(unknown) == 1:
                roots = [r for r in sympy.solve(expr - n, unknown[0]) if r.is_integer]
                if roots:
                    sizes[str(unknown[0])] = int(roots[0])
            bound = expr.xreplace({src.symbols[k]: v for k, v in sizes.items()})
            if bound.free_symbols or int(bound) != n:
                raise UserError(f"input `{name}` has shape {list(shapes[name])}; {self._takes()}")
        for d in self.dims:
            sizes.setdefault(d.symbol, self.sizes[d.symbol])
        return self.at_sizes(sizes)

    def at_bucket(self, bucket: str) -> ExportedModel:
        """The program at a bucket id (`shape-4x3x8-4`, polymorph/search/registry.py's program_bucket)."""
        from polymorph.search.registry import parse_program_bucket

        shapes = parse_program_bucket(bucket)
        if len(shapes) != len(self.input_names):
            raise UserError(
                f"bucket `{bucket}` gives {len(shapes)} input shape(s); `{self.name}` takes "
                f"{len(self.input_names)}: {self._takes()}"
            )
        return self.at(dict(zip(self.input_names, shapes, strict=True)))

    def _takes(self) -> str:
        src = self._source
        shapes = ", ".join(
            f"{n} [{', '.join(str(e) for e in (src.dims[n] if src else self.input_shapes()[n]))}]"
            for n in self.input_names
        )
        ranges = "; ".join(d.describe() for d in self.dims)
        return f"the program takes {shapes}" + (f" with {ranges}" if ranges else "")

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
    """Export `module` with torch.export (non-strict) at `example_inputs` and import the program.
    `dynamic_shapes` is torch.export's (`{"x": {0: Dim("batch", min=1, max=64)}}`): the model is
    imported at the example's sizes and `at(shapes)` takes it to any others within the ranges."""
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
    """A file `torch.export.save` wrote, at its example inputs' shapes; `FILE.pt2@BUCKET` (a bucket id,
    `shape-4x3x8`) at that bucket's. `static` is accepted for older callers: a dynamic program is
    imported at its example shapes either way."""
    import torch

    text = str(path)
    bucket = None
    if ".pt2@" in text:
        text, bucket = text.rsplit("@", 1)
    path = Path(text)
    if not path.is_file():
        raise UserError(f"no such file: {path}; give a .pt2 file written by torch.export.save")
    try:
        with _quiet():
            program = torch.export.load(str(path))
    except Exception as e:
        raise UserError(f"{path}: not a torch.export program ({type(e).__name__}: {str(e)[:200]})") from None
    model = from_program(program, name=path.stem, dtype=dtype)
    if bucket is not None:
        model = model.at_bucket(bucket)
    model.source = str(path.resolve()) + (f"@{bucket}" if bucket is not None else "")
    return model


def from_program(
    program: Any, *, name: str = "exported", static: bool = False, dtype: str | DType | None = None
) -> ExportedModel:
    """An ExportedProgram (any dialect) as an ExportedModel: core ATen decompositions, then import at
    the example inputs' sizes of its dynamic dims (`static` is accepted for older callers).
    `dtype`: every float32 value of the program (weights, inputs, intermediates) becomes this dtype;
    None keeps the program's own dtypes."""
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
    float_dtype = None if float_dtype == DType.F32 else float_dtype
    symbols, dims, input_dims = _dynamic_dims(decomposed, program, name)
    sizes = {d.symbol: d.example for d in dims}
    graph, weights, names = _import(decomposed, name, {symbols[k]: v for k, v in sizes.items()}, float_dtype)
    _record_int_ranges(graph, program, names)
    return ExportedModel(
        name=name,
        graph=graph,
        source=name,
        _weights=weights,
        program=program,
        input_names=names,
        dims=dims,
        sizes=sizes,
        _source=_Source(decomposed, symbols, input_dims, float_dtype) if dims else None,
    )


def _import(
    decomposed: Any, name: str, sizes: Mapping[Any, int], float_dtype: DType | None
) -> tuple[Graph, dict[str, np.ndarray], tuple[str, ...]]:
    from polymorph.frontend.aten import Importer
    from polymorph.ir.spec import verify
    from polymorph.passes.recognize import recognize

    importer = Importer(decomposed, name, sizes=sizes, dtype=float_dtype)
    graph: Graph = importer.run()
    verify(graph)
    # The LLM patterns (rmsnorm, linear, rope, attention...) raised to the builder's ops, so that the
    # builder's fusions and kernels apply: here, where the constants they are checked against are known.
    recognized = recognize(graph, importer.weights)
    return recognized.graph, recognized.weights, tuple(importer.input_names)


def _dynamic_dims(
    decomposed: Any, program: Any, name: str
) -> tuple[dict[str, Any], tuple[DynamicDim, ...], dict[str, tuple[Any, ...]]]:
    """The program's dynamic dims (their symbols by name, each with its declared range and example
    size) and each user input's dims as ints or expressions of those symbols."""
    import torch
    from torch.utils._sympy.numbers import int_oo

    user = set(decomposed.graph_signature.user_inputs)
    placeholders = [n for n in decomposed.graph.nodes if n.op == "placeholder" and n.name in user]
    examples = _example_tensors(program)
    symbols: dict[str, Any] = {}
    example: dict[str, int] = {}
    input_dims: dict[str, tuple[Any, ...]] = {}
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue  # the importer refuses a non-tensor input by name
        exprs: list[Any] = []
        for axis, d in enumerate(val.shape):
            if isinstance(d, int):
                exprs.append(d)
                continue
            expr = d.node.expr
            exprs.append(expr)
            for s in expr.free_symbols:
                symbols[str(s)] = s
            if expr.is_Symbol and str(expr) not in example:
                hint = getattr(d.node, "hint", None)
                if hint is None and i < len(examples) and examples[i] is not None:
                    hint = int(examples[i].shape[axis])
                if hint is not None:
                    example[str(expr)] = int(hint)
            # A symbol seen only inside a derived dim (2*s0): its example value from the shape env.
            env = getattr(d.node, "shape_env", None)
            known = getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", None) or {}
            for s in expr.free_symbols:
                if str(s) not in example and s in known:
                    example[str(s)] = int(known[s])
        input_dims[node.name] = tuple(exprs)
    dims = []
    ranges = {str(k): v for k, v in decomposed.range_constraints.items()}
    for sym in sorted(symbols):
        if sym not in example:
            raise UserError(
                f"`{name}`: dynamic dim {sym} appears in no input as a dim of its own, or the program has no "
                "example inputs to size it by; export it with example inputs, or with static shapes"
            )
        vr = ranges.get(sym)
        lo = int(vr.lower) if vr is not None and vr.lower.is_finite else 0
        hi = None if vr is None or vr.upper == int_oo or not vr.upper.is_finite else int(vr.upper)
        dims.append(DynamicDim(sym, lo, hi, example[sym]))
    return symbols, tuple(dims), input_dims


def _example_tensors(program: Any) -> list[Any]:
    """The program's example inputs in user-input order (torch.export keeps them, .pt2 files too),
    or [] when it has none."""
    import torch
    import torch.utils._pytree as pytree

    got = getattr(program, "example_inputs", None)
    if not got:
        return []
    try:
        return [t if isinstance(t, torch.Tensor) else None for t in pytree.tree_leaves(got)]
    except Exception:  # an odd container: no examples, the hints size the dims
        return []


def _record_int_ranges(graph: Graph, program: Any, names: Sequence[str]) -> None:
    """graph.meta["int_ranges"]: each integer input's range [lo, hi) in the example inputs, which the
    gates and fresh inputs draw from where no index use bounds it (polymorph/ir/int_ranges.py)."""
    examples = _example_tensors(program)
    ranges = {}
    for name, t in zip(names, examples, strict=False):
        if t is None or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == _torch_bool():
            continue
        if t.numel():
            ranges[name] = [int(t.min()), int(t.max()) + 1]
    if ranges:
        graph.meta["int_ranges"] = ranges


def _torch_bool() -> Any:
    import torch

    return torch.bool
