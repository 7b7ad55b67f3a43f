"""Core ATen ops to IR ops: the table torch.export imports through (see torch_export.py).

Each converter takes the importer and an fx node and returns the node's value: an IR value name, a
torch tensor (a constant: the node depends on no input and no weight, so PyTorch computes it here),
or a tuple of those for a multi-output op. Every IR value is checked against the dtype and shape the
program's own metadata gives (`node.meta["val"]`); operands are cast to the dtype PyTorch computes
in (type promotion), so the IR's same-dtype ops see what ATen computed. An ATen op outside `CONVERT`
is refused by name, with the node that uses it.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from polymorph.errors import UserError
from polymorph.ir.builder import GraphBuilder
from polymorph.ir.dtypes import DType
from polymorph.ir.graph import TensorType
from polymorph.ir.ops import OpError, infer_node, normalize_attrs, op_def

TORCH_TO_IR = {
    torch.float32: DType.F32,
    torch.bfloat16: DType.BF16,
    torch.float16: DType.F16,
    torch.int32: DType.I32,
    torch.int64: DType.I64,
    torch.bool: DType.BOOL,
    torch.complex64: DType.C64,
}
IR_TO_TORCH = {v: k for k, v in TORCH_TO_IR.items()}


class Unsupported(UserError):
    """An ATen op, or a use of one, that the general op set does not cover."""


class Absent:
    """An output of a multi-output ATen op that the import does not produce (batch norm's saved
    statistics, max pooling's indices): reading it is refused."""

    def __init__(self, what: str) -> None:
        self.what = what


def ir_dtype(dtype: torch.dtype, where: str) -> DType:
    try:
        return TORCH_TO_IR[dtype]
    except KeyError:
        raise Unsupported(
            f"{where}: dtype {dtype} has no IR dtype (known: f32 bf16 f16 i32 i64 bool c64)"
        ) from None


def _np(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


class Importer:
    def __init__(
        self, program: Any, name: str, *, sizes: Mapping[Any, int] | None = None, dtype: DType | None = None
    ) -> None:
        self.program = program
        self.b = GraphBuilder(name, meta={"source": "torch.export"})
        self.types: dict[str, TensorType] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.env: dict[Any, Any] = {}
        self.input_names: list[str] = []
        # The size of each dynamic dim's symbol (a sympy Symbol of the program's shape environment):
        # the graph is imported static at these sizes (torch_export.py chooses them).
        self.sizes = dict(sizes or {})
        self.float_dtype = dtype  # every f32 of the program becomes this dtype (--dtype); None keeps f32
        self.fx: Any = None  # the node being converted
        self._count = 0
        # A constant tensor's param, keyed by the tensor's id; the tensor is kept too, so that its id is
        # not reused by a later temporary (which would then be handed this one's param)
        self._consts: dict[Any, tuple[torch.Tensor, str]] = {}

    def ir_dtype(self, dtype: torch.dtype, where: str) -> DType:
        d = ir_dtype(dtype, where)
        return self.float_dtype if d == DType.F32 and self.float_dtype is not None else d

    # --- the walk ------------------------------------------------------------------------------------

    def run(self) -> Any:
        sig = self.program.graph_signature
        params = dict(sig.inputs_to_parameters)
        buffers = dict(sig.inputs_to_buffers)
        consts = dict(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})
        state = self.program.state_dict
        user_inputs = list(sig.user_inputs)
        floats: list[DType] = []
        for node in self.program.graph.nodes:
            self.fx = node
            if node.op == "placeholder":
                if node.name in params or node.name in buffers:
                    fqn = params.get(node.name) or buffers[node.name]
                    tensor = state[fqn] if fqn in state else self.program.constants[fqn]
                    self.env[node] = self.param(fqn, tensor)
                elif node.name in consts:
                    self.env[node] = self.program.constants[consts[node.name]].detach().clone()
                elif node.name in user_inputs:
                    self.env[node] = self.user_input(node)
                    t = self.types[self.env[node]]
                    if t.dtype.is_float:
                        floats.append(t.dtype)
                else:
                    raise Unsupported(f"placeholder `{node.name}` is neither an input nor a weight")
            elif node.op == "call_function":
                self.env[node] = self.call(node)
            elif node.op == "output":
                self.outputs(node)
        self.b.graph.meta["dtype"] = (floats[0] if floats else DType.F32).value
        self.b.graph.meta["inputs"] = list(self.input_names)
        return self.b.build(check=False)

    def user_input(self, node: Any) -> str:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise Unsupported(
                f"input `{node.name}` is {type(val).__name__}, not a tensor; export with tensors only"
            )
        shape = self.shape_of(val, f"input `{node.name}`")
        dtype = self.ir_dtype(val.dtype, f"input `{node.name}`")
        self.b.input(node.name, dtype, shape)
        self.types[node.name] = TensorType(dtype, shape)
        self.input_names.append(node.name)
        return node.name

    def shape_of(self, val: torch.Tensor, where: str) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else int(self.sym_value(d, where)) for d in val.shape)

    def sym_value(self, value: Any, where: str) -> Any:
        """A symbolic size (SymInt, SymFloat, SymBool) at this import's sizes; an unbacked one (a
        size read from a tensor's values, `.item()`, `nonzero`) has none and is refused."""
        expr = value.node.expr
        got = expr.xreplace(self.sizes) if hasattr(expr, "xreplace") else expr
        if getattr(got, "free_symbols", None):
            free = ", ".join(sorted(map(str, got.free_symbols)))
            raise Unsupported(
                f"{where} has a size ({expr}) that depends on tensor values ({free}), not on input shapes; "
                "polymorph imports data-independent shapes only"
            )
        if isinstance(value, torch.SymBool):
            return bool(got)
        return float(got) if isinstance(value, torch.SymFloat) else int(got)

    def outputs(self, node: Any) -> None:
        import torch.utils._pytree as pytree

        for i, arg in enumerate(pytree.tree_leaves(node.args[0])):
            if arg is None:
                continue
            value = self.value(arg)
            if not isinstance(value, str):
                value = self.materialize(value, None, f"output_{i}")
            self.b.output(f"output_{i}", value)

    def call(self, node: Any) -> Any:
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
            # Shape arithmetic (sym_size, mul of sizes): its value at this import's sizes.
            return self.sym_value(val, f"node `{node.name}`")
        if node.target is operator.getitem:
            parent, index = node.args
            got = self.env[parent][index]
            if isinstance(got, Absent):
                raise Unsupported(f"node `{node.name}` reads {got.what}, which the import does not compute")
            return got
        key = str(node.target)
        if key in SKIP:
            return None
        args = [self.value(a) for a in node.args]
        kwargs = {k: self.value(v) for k, v in node.kwargs.items()}
        if self.constant_only(args, kwargs) or key in SHAPE_ONLY:
            return self.fold(node, key)
        convert = CONVERT.get(key)
        if convert is None:
            raise Unsupported(
                f"ATen op `{key}` (node `{node.name}`) is outside polymorph's general op set; "
                "see polymorph/ir/general_ops.py for the ops it imports"
            )
        # A constant tensor beside IR values becomes a const param, so converters see IR values only.
        args = [self.lift(a) for a in args]
        kwargs = {k: self.lift(v) for k, v in kwargs.items()}
        try:
            out = convert(self, node, args, kwargs)
        except OpError as e:
            raise Unsupported(f"node `{node.name}` ({key}): {e}") from None
        if isinstance(out, str):
            self.check(node, out)
        return out

    def constant_only(self, args: list[Any], kwargs: dict[str, Any]) -> bool:
        import torch.utils._pytree as pytree

        leaves = pytree.tree_leaves([args, kwargs])
        return not any(isinstance(x, str) for x in leaves)

    def fold(self, node: Any, key: str) -> torch.Tensor:
        """The node computed by PyTorch now: every tensor it reads is a constant (a `*_like` op reads
        only its argument's shape and dtype, so zeros of that kind stand in for an IR value)."""
        import torch.utils._pytree as pytree

        def real(x: Any) -> Any:
            if isinstance(x, str):
                t = self.types[x]
                return torch.zeros(t.shape, dtype=IR_TO_TORCH[t.dtype])
            return x

        args = pytree.tree_map(real, [self.value(a) for a in node.args])
        kwargs = pytree.tree_map(real, {k: self.value(v) for k, v in node.kwargs.items()})
        with torch.no_grad():
            out = node.target(*args, **kwargs)
        return out  # a constant of a dtype no IR dtype holds is refused where an IR op reads it (lift)

    def lift(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype not in TORCH_TO_IR:
            raise Unsupported(
                f"node `{self.fx.name}` ({self.fx.target}) reads a {value.dtype} constant, which no IR dtype holds"
            )
        if isinstance(value, torch.Tensor):
            return self.materialize(value, None, "const")
        if isinstance(value, list | tuple):
            return type(value)(self.lift(v) for v in value)
        return value

    def value(self, arg: Any) -> Any:
        import torch.fx

        if isinstance(arg, torch.fx.Node):
            return self.env[arg]
        if isinstance(arg, list | tuple):
            return type(arg)(self.value(a) for a in arg)
        return arg

    # --- emitting IR -----------------------------------------------------------------------------------

    def node_name(self, suffix: str = "") -> str:
        node = self.fx
        stack = node.meta.get("nn_module_stack") or {}
        path = ""
        if stack:
            path = list(stack.values())[-1][0]
            path = re.sub(r"^L\['self'\]\.?|^L__self___", "", str(path))
            path = re.sub(r"[^A-Za-z0-9_.]", "_", path).strip(".")
        base = f"{path}.{node.name}" if path else node.name
        if suffix:
            self._count += 1
            base = f"{base}.{suffix}{self._count}"
        return base

    def emit(self, op: str, inputs: Sequence[str], suffix: str = "", **attrs: Any) -> str:
        if op not in COMPLEX_OPS and any(self.types[v].dtype == DType.C64 for v in inputs):
            # the general ops' arithmetic is real: a complex operand would lose its imaginary part
            raise Unsupported(
                f"node `{self.fx.name}` ({self.fx.target}) on complex values: {COMPLEX_SUPPORT}"
            )
        name = self.node_name(suffix)
        attrs = normalize_attrs(op_def(op), attrs)
        from polymorph.ir.graph import Node

        node = Node(name, op, tuple(inputs), (name,), attrs)
        (t,) = infer_node(node, [self.types[v] for v in inputs])
        self.b.graph.nodes.append(node)
        self.types[name] = t
        return name

    def param(self, fqn: str, tensor: torch.Tensor) -> str:
        dtype = self.ir_dtype(tensor.dtype, f"weight `{fqn}`")
        shape = tuple(int(d) for d in tensor.shape)
        self.b.param(fqn, dtype, shape)
        self.types[fqn] = TensorType(dtype, shape)
        self.weights[fqn] = _np(
            tensor.to(IR_TO_TORCH[dtype]) if dtype != TORCH_TO_IR.get(tensor.dtype) else tensor
        )
        return fqn

    def materialize(self, value: Any, dtype: DType | None, hint: str) -> str:
        """A constant (tensor or Python scalar) as a const param of `dtype` (its own when None)."""
        if isinstance(value, torch.Tensor):
            t = value.detach()
            if dtype is not None:
                t = t.to(IR_TO_TORCH[dtype])
        else:
            if dtype is None:
                dtype = (
                    DType.BOOL
                    if isinstance(value, bool)
                    else DType.I64
                    if isinstance(value, int)
                    else DType.F32
                )
            t = torch.tensor(value, dtype=IR_TO_TORCH[dtype])
        key = (
            id(value) if isinstance(value, torch.Tensor) else hash((repr(value), repr(value.__class__))),
            str(t.dtype),
        )
        if key in self._consts and isinstance(value, torch.Tensor) and self._consts[key][0] is value:
            return self._consts[key][1]
        self._count += 1
        name = f"const.{self.fx.name if self.fx is not None else hint}.{self._count}"
        self.param(name, t)
        if isinstance(value, torch.Tensor):
            self._consts[key] = (value, name)
        return name

    def operand(self, value: Any, dtype: DType) -> str:
        """`value` (IR value or constant) as an IR value of `dtype`."""
        if not isinstance(value, str):
            return self.materialize(value, dtype, "const")
        if self.types[value].dtype != dtype:
            return self.emit("cast", [value], "cast", dtype=dtype.value)
        return value

    def out_type(self, node: Any | None = None) -> TensorType:
        node = node or self.fx
        val = node.meta["val"]
        if isinstance(val, list | tuple):
            val = val[0]
        return TensorType(
            self.ir_dtype(val.dtype, f"node `{node.name}`"), self.shape_of(val, f"node `{node.name}`")
        )

    def check(self, node: Any, value: str) -> None:
        want, got = self.out_type(node), self.types[value]
        if want.shape != got.shape:
            raise Unsupported(
                f"node `{node.name}` ({node.target}): the import made {got}, PyTorch makes {want} (an import bug)"
            )
        if want.dtype != got.dtype:
            self.env[node] = self.emit("cast", [value], "cast", dtype=want.dtype.value)

    def reshape(self, value: str, shape: Sequence[int]) -> str:
        if tuple(self.types[value].shape) == tuple(shape):
            return value
        return self.emit("reshape", [value], "reshape", shape=tuple(int(s) for s in shape))


# --- converters --------------------------------------------------------------------------------------


def promoted(*values: Any, imp: Importer) -> DType:
    """The dtype PyTorch computes a binary op in (tensors by dtype and rank, scalars by kind)."""
    proxies = []
    for v in values:
        if isinstance(v, str):
            t = imp.types[v]
            proxies.append(torch.empty((1,) * t.rank, dtype=IR_TO_TORCH[t.dtype]))
        elif isinstance(v, torch.Tensor):
            proxies.append(torch.empty((1,) * v.dim(), dtype=v.dtype))
        else:
            proxies.append(v)
    dtype = proxies[0] if len(proxies) == 1 else None
    if dtype is None:
        result = torch.result_type(proxies[0], proxies[1])
        for p in proxies[2:]:
            result = torch.result_type(torch.empty(1, dtype=result), p)
        return imp.ir_dtype(result, "type promotion")
    return imp.ir_dtype(proxies[0].dtype, "type promotion")


def _unary(op: str) -> Callable:
    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
        if isinstance(args[0], str) and imp.types[args[0]].dtype == DType.C64:
            re, im = _parts(imp, args[0])
            if op == "abs":  # |z|
                sq = imp.emit("add", [imp.emit("mul", [re, re], "rr"), imp.emit("mul", [im, im], "ii")], "sq")
                return imp.emit("sqrt", [sq])
            if op == "neg":
                return _complex(imp, imp.emit("neg", [re], "re"), imp.emit("neg", [im], "im"))
            raise Unsupported(f"node `{node.name}` ({node.target}) on complex values: {COMPLEX_SUPPORT}")
        return imp.emit(op, [imp.operand(args[0], imp.out_type().dtype)])

    return convert


def _gelu(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    return imp.emit(
        "gelu", [args[0]], approximate=kwargs.get("approximate", args[1] if len(args) > 1 else "none")
    )


def _parts(imp: Importer, value: Any) -> tuple[str, str | None]:
    """(real, imaginary) f32 parts of a complex value; a real value is (itself, None)."""
    if not isinstance(value, str) or imp.types[value].dtype != DType.C64:
        if not isinstance(value, str) and isinstance(value, complex | torch.Tensor):
            value = imp.materialize(torch.as_tensor(value, dtype=torch.complex64), DType.C64, "complex")
        else:
            return imp.operand(value, DType.F32), None
    pairs = imp.emit("view_as_real", [value], "parts")  # [*, 2]
    shape = imp.types[value].shape
    re = imp.reshape(imp.emit("slice", [pairs], "re", axis=-1 % (len(shape) + 1), start=0, end=1), shape)
    im = imp.reshape(imp.emit("slice", [pairs], "im", axis=-1 % (len(shape) + 1), start=1, end=2), shape)
    return re, im


def _complex(imp: Importer, re: str, im: str | None) -> str:
    """The complex value of f32 parts (a missing imaginary part is zero) broadcast to one shape."""
    if im is None:
        im = imp.emit("mul", [re, imp.materialize(0.0, DType.F32, "zero")], "zero_im")
    shape = tuple(np.broadcast_shapes(tuple(imp.types[re].shape), tuple(imp.types[im].shape)))
    cols = []
    for v in (re, im):
        if tuple(imp.types[v].shape) != shape:
            v = imp.emit(
                "expand",
                [imp.reshape(v, (1,) * (len(shape) - imp.types[v].rank) + tuple(imp.types[v].shape))],
                "bcast",
                shape=shape,
            )
        cols.append(imp.reshape(v, (*shape, 1)))
    pairs = imp.emit("concat", cols, "pairs", axis=len(shape))
    return imp.emit("view_as_complex", [pairs])


def _complex_binary(imp: Importer, node: Any, op: str, a: Any, b: Any) -> str:
    """A complex add, sub, mul or div in real arithmetic on the parts (the general ops' elementwise
    kernels compute in real float32)."""
    (ar, ai), (br, bi) = _parts(imp, a), _parts(imp, b)

    if op in ("add", "sub"):
        re = imp.emit(op, [ar, br], op)
        if bi is None:
            im = ai
        elif ai is None:
            im = bi if op == "add" else imp.emit("neg", [bi], "neg")
        else:
            im = imp.emit(op, [ai, bi], op)
        return _complex(imp, re, im)
    if op == "mul":
        re = imp.emit("mul", [ar, br], "rr")
        if ai is not None and bi is not None:
            re = imp.emit("sub", [re, imp.emit("mul", [ai, bi], "ii")], "re")
        terms = [imp.emit("mul", [ar, bi], "ri")] if bi is not None else []
        terms += [imp.emit("mul", [ai, br], "ir")] if ai is not None else []
        im = terms[0] if len(terms) == 1 else imp.emit("add", terms, "im") if terms else None
        return _complex(imp, re, im)
    if op == "div":
        if bi is None:
            return _complex(
                imp, imp.emit("div", [ar, br], "re"), None if ai is None else imp.emit("div", [ai, br], "im")
            )
        denom = imp.emit("add", [imp.emit("mul", [br, br], "bb"), imp.emit("mul", [bi, bi], "bb")], "denom")
        re = imp.emit("mul", [ar, br], "rr")
        im = imp.emit("neg", [imp.emit("mul", [ar, bi], "ri")], "neg")
        if ai is not None:
            re = imp.emit("add", [re, imp.emit("mul", [ai, bi], "ii")], "re")
            im = imp.emit("add", [im, imp.emit("mul", [ai, br], "ir")], "im")
        return _complex(imp, imp.emit("div", [re, denom], "re"), imp.emit("div", [im, denom], "im"))
    raise Unsupported(f"node `{node.name}` ({node.target}) on complex values: {COMPLEX_SUPPORT}")


def _conj(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    if not (isinstance(args[0], str) and imp.types[args[0]].dtype == DType.C64):
        return args[0]  # the conjugate of a real tensor is itself
    re, im = _parts(imp, args[0])
    return _complex(imp, re, imp.emit("neg", [im], "conj"))


def _complex_ctor(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    return _complex(imp, imp.operand(args[0], DType.F32), imp.operand(args[1], DType.F32))


def _polar(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    r, theta = imp.operand(args[0], DType.F32), imp.operand(args[1], DType.F32)
    re = imp.emit("mul", [r, imp.emit("cos", [theta], "cos")], "re")
    return _complex(imp, re, imp.emit("mul", [r, imp.emit("sin", [theta], "sin")], "im"))


def _hypot(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    dtype = imp.out_type().dtype
    a, b = imp.operand(args[0], dtype), imp.operand(args[1], dtype)
    sq = imp.emit("add", [imp.emit("mul", [a, a], "aa"), imp.emit("mul", [b, b], "bb")], "sq")
    return imp.emit("sqrt", [sq])


def _cdist(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    """cdist(x1[*, P, M], x2[*, R, M], p) = ||x1[i] - x2[j]||_p, from the broadcast differences."""
    x1, x2, p = args[0], args[1], float(args[2])
    dtype = imp.out_type().dtype
    x1, x2 = imp.operand(x1, dtype), imp.operand(x2, dtype)
    t1, t2 = imp.types[x1], imp.types[x2]
    a = imp.reshape(x1, (*t1.shape[:-1], 1, t1.shape[-1]))  # [*, P, 1, M]
    b = imp.reshape(x2, (*t2.shape[:-2], 1, *t2.shape[-2:]))  # [*, 1, R, M]
    diff = imp.emit("sub", [a, b], "diff")
    return _vector_norm(imp, node, [diff, p, [-1], False], {})


def _binary(op: str, alpha: bool = False, reverse: bool = False) -> Callable:
    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
        a, b = args[0], args[1]
        if reverse:
            a, b = b, a
        dtype = imp.out_type().dtype
        scale = kwargs.get("alpha", args[2] if alpha and len(args) > 2 else 1)
        if dtype == DType.C64:
            if scale != 1:
                b = _complex_binary(imp, node, "mul", b, scale)
            return _complex_binary(imp, node, op, a, b)
        x = imp.operand(a, dtype)
        y = imp.operand(b, dtype)
        if scale != 1:
            y = imp.emit("mul", [y, imp.materialize(scale, dtype, "alpha")], "alpha")
        return imp.emit(op, [x, y])

    return convert


def _compare(op: str) -> Callable:
    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
        dtype = promoted(args[0], args[1], imp=imp)
        return imp.emit(op, [imp.operand(args[0], dtype), imp.operand(args[1], dtype)])

    return convert


def _logical(op: str, bitwise: bool = False) -> Callable:
    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
        if bitwise and imp.out_type().dtype != DType.BOOL:
            raise Unsupported(
                f"node `{node.name}` ({node.target}) on integers: bitwise ops are outside the op set"
            )
        return imp.emit(op, [imp.operand(args[0], DType.BOOL), imp.operand(args[1], DType.BOOL)])

    return convert


def _div_mode(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    mode = kwargs.get("rounding_mode", args[2] if len(args) > 2 else None)
    dtype = imp.out_type().dtype
    y = imp.emit("div", [imp.operand(args[0], dtype), imp.operand(args[1], dtype)])
    if mode is None or not dtype.is_float:
        if mode == "trunc" and not dtype.is_float:
            raise Unsupported(
                f"node `{node.name}`: integer division rounding toward zero is outside the op set"
            )
        return y
    return imp.emit("floor" if mode == "floor" else "trunc", [y], mode)


def _clamp(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    lo = kwargs.get("min", args[1] if len(args) > 1 else None)
    hi = kwargs.get("max", args[2] if len(args) > 2 else None)
    dtype = imp.out_type().dtype
    x = imp.operand(args[0], dtype)
    if lo is not None:
        x = imp.emit("maximum", [x, imp.operand(lo, dtype)], "min")
    if hi is not None:
        x = imp.emit("minimum", [x, imp.operand(hi, dtype)], "max")
    return x


def _clamp_side(side: str) -> Callable:
    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
        dtype = imp.out_type().dtype
        return imp.emit(side, [imp.operand(args[0], dtype), imp.operand(args[1], dtype)])

    return convert


def _where(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    dtype = imp.out_type().dtype
    if dtype == DType.C64:  # each part chosen on its own
        c = imp.operand(args[0], DType.BOOL)
        (ar, ai), (br, bi) = _parts(imp, args[1]), _parts(imp, args[2])
        zero = imp.materialize(0.0, DType.F32, "zero")
        re = imp.emit("where", [c, ar, br], "re")
        return _complex(imp, re, imp.emit("where", [c, ai or zero, bi or zero], "im"))
    return imp.emit(
        "where", [imp.operand(args[0], DType.BOOL), imp.operand(args[1], dtype), imp.operand(args[2], dtype)]
    )


def _dims(value: Any, rank: int) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value % rank,) if rank else ()
    return tuple(int(d) % rank for d in value) if rank else ()


def _reduce(op: str, dims_at: int | None = 1, keep_at: int | None = 2) -> Callable:
    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
        x = args[0]
        out = imp.out_type()
        rank = imp.types[x].rank
        dims = kwargs.get("dim", args[dims_at] if dims_at is not None and len(args) > dims_at else None)
        keep = kwargs.get("keepdim", args[keep_at] if keep_at is not None and len(args) > keep_at else False)
        if op in ("reduce_sum", "reduce_prod", "reduce_mean", "reduce_max", "reduce_min"):
            x = imp.operand(x, out.dtype)
        axes = _dims(dims, rank)
        if out.dtype == DType.C64 and op in ("reduce_sum", "reduce_mean") and rank:  # each part on its own
            parts = [imp.emit(op, [p], op, axes=axes or tuple(range(rank)), keepdims=bool(keep))
                     for p in _parts(imp, x)]  # fmt: skip
            return _complex(imp, *parts)
        if rank == 0:
            return imp.emit("reshape", [x], "scalar", shape=())
        return imp.emit(op, [x], axes=axes or tuple(range(rank)), keepdims=bool(keep))

    return convert


def _var(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x = args[0]
    rank = imp.types[x].rank
    dims = kwargs.get("dim", args[1] if len(args) > 1 else None)
    correction = kwargs.get("correction", 1)
    correction = 1 if correction is None else correction
    keep = kwargs.get("keepdim", False)
    return imp.emit("reduce_var", [imp.operand(x, imp.out_type().dtype)], axes=_dims(dims, rank) or tuple(range(rank)),
                    keepdims=bool(keep), correction=float(correction))  # fmt: skip


def _var_mean(imp: Importer, node: Any, args: list, kwargs: dict) -> tuple:
    x = args[0]
    rank = imp.types[x].rank
    dims = kwargs.get("dim", args[1] if len(args) > 1 else None)
    keep = bool(kwargs.get("keepdim", False))
    dtype = imp.out_type().dtype
    x = imp.operand(x, dtype)
    var = _var(imp, node, [x, *args[1:]], kwargs)
    mean = imp.emit("reduce_mean", [x], "mean", axes=_dims(dims, rank) or tuple(range(rank)), keepdims=keep)
    return (var, mean)


def _argmax(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x = args[0]
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    keep = kwargs.get("keepdim", args[2] if len(args) > 2 else False)
    if dim is None:
        x = imp.reshape(x, (int(np.prod(imp.types[x].shape)),))
        dim = 0
    y = imp.emit("argmax", [x], axis=int(dim))
    y = imp.emit("cast", [y], "i64", dtype="i64")
    return imp.reshape(y, imp.out_type().shape) if keep else y


def _argmin(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    # the first minimum is the first maximum of -x
    return _argmax(imp, node, [imp.emit("neg", [args[0]], "neg"), *args[1:]], kwargs)


def _max_dim(op: str) -> Callable:
    """max.dim / min.dim: (values, indices) along one dim, as a reduction and an argmax."""

    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> tuple:
        x, dim = args[0], int(args[1])
        keep = bool(kwargs.get("keepdim", args[2] if len(args) > 2 else False))
        rank = imp.types[x].rank
        values = imp.emit(op, [x], "values", axes=(dim % rank,), keepdims=keep)
        find = _argmax if op == "reduce_max" else _argmin
        return (values, find(imp, node, [x, dim, keep], {}))

    return convert


def _cumsum(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    dtype = imp.out_type().dtype
    return imp.emit("cumsum", [imp.operand(args[0], dtype)], axis=int(args[1]))


def _softmax(op: str) -> Callable:
    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
        return imp.emit(op, [imp.operand(args[0], imp.out_type().dtype)], axis=int(args[1]))

    return convert


def _mm(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    dtype = imp.out_type().dtype
    a, b = imp.operand(args[0], dtype), imp.operand(args[1], dtype)
    return imp.emit("cmatmul" if dtype == DType.C64 else "matmul", [a, b])


def _addmm(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    dtype = imp.out_type().dtype
    bias, a, b = (imp.operand(v, dtype) for v in args[:3])
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    y = imp.emit("cmatmul" if dtype == DType.C64 else "matmul", [a, b], "mm")
    if alpha != 1:
        y = imp.emit("mul", [y, imp.materialize(alpha, dtype, "alpha")], "alpha")
    if beta != 1:
        bias = imp.emit("mul", [bias, imp.materialize(beta, dtype, "beta")], "beta")
    return imp.emit("add", [y, bias])


def _ints(v: Any, n: int) -> tuple[int, ...]:
    v = [v] if isinstance(v, int) else list(v)
    if len(v) == 1 and n > 1:
        v = v * n
    return tuple(int(x) for x in v)


def _convolution(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = args[:9]
    n = imp.types[w].rank - 2
    dtype = imp.out_type().dtype
    if transposed:
        return _conv_transpose(imp, node, [imp.operand(v, dtype) if v is not None else None for v in (x, w, b)],
                               _ints(stride, n), _ints(padding, n), _ints(dilation, n), _ints(output_padding, n),
                               int(groups))  # fmt: skip
    inputs = [imp.operand(x, dtype), imp.operand(w, dtype)] + (
        [imp.operand(b, dtype)] if b is not None else []
    )
    return imp.emit("conv", inputs, stride=_ints(stride, n), padding=_ints(padding, n), dilation=_ints(dilation, n),
                    groups=int(groups))  # fmt: skip


def _zeros_along(imp: Importer, x: str, axis: int, count: int) -> str:
    """Zeros of x's shape but `count` along `axis` (a broadcast scalar, not a stored constant)."""
    t = imp.types[x]
    shape = (*t.shape[:axis], count, *t.shape[axis + 1 :])
    zero = imp.reshape(imp.materialize(0.0, t.dtype, "zero"), (1,) * t.rank)
    return imp.emit("expand", [zero], "zeros", shape=tuple(int(d) for d in shape))


def _pad_axis(imp: Importer, x: str, axis: int, left: int, right: int) -> str:
    """x zero-padded along `axis` (a negative amount crops)."""
    size = int(imp.types[x].shape[axis])
    lo, hi = max(-left, 0), size - max(-right, 0)
    if lo or hi != size:
        x = imp.emit("slice", [x], "crop", axis=axis, start=lo, end=hi)
    pieces = [_zeros_along(imp, x, axis, left)] if left > 0 else []
    pieces += [x] + ([_zeros_along(imp, x, axis, right)] if right > 0 else [])
    return x if len(pieces) == 1 else imp.emit("concat", pieces, "pad", axis=axis)


def _conv_transpose(imp: Importer, node: Any, xwb: list, stride: tuple, padding: tuple, dilation: tuple,
                    output_padding: tuple, groups: int) -> str:  # fmt: skip
    """A transposed convolution as the conv it is the gradient of: the input with stride - 1 zeros
    between its elements, padded by dilation * (k - 1) - padding (output_padding more on the right),
    convolved at stride 1 with the weight's in/out channels swapped per group and its taps flipped."""
    x, w, b = xwb
    wt = imp.types[w]
    cin, cout_g, kernel = int(wt.shape[0]), int(wt.shape[1]), [int(k) for k in wt.shape[2:]]
    n = len(kernel)
    for i in range(n):
        axis, s = 2 + i, stride[i]
        if s > 1:  # [.., L, ..] -> [.., L, s, ..] with zeros after each element -> [.., (L-1)*s+1, ..]
            t = imp.types[x]
            size = int(t.shape[axis])
            col = imp.reshape(x, (*t.shape[: axis + 1], 1, *t.shape[axis + 1 :]))
            spread = imp.emit(
                "concat", [col, _zeros_along(imp, col, axis + 1, s - 1)], "spread", axis=axis + 1
            )
            x = imp.reshape(spread, (*t.shape[:axis], size * s, *t.shape[axis + 1 :]))
            x = imp.emit("slice", [x], "spread", axis=axis, start=0, end=(size - 1) * s + 1)
        edge = dilation[i] * (kernel[i] - 1) - padding[i]
        x = _pad_axis(imp, x, axis, edge, edge + output_padding[i])
    # w: [Cin, Cout/g, *K] -> [Cout, Cin/g, *K], taps flipped
    w = imp.reshape(w, (groups, cin // groups, cout_g, *kernel))
    w = imp.emit("transpose", [w], "swap", perm=(0, 2, 1, *range(3, 3 + n)))
    w = imp.reshape(w, (groups * cout_g, cin // groups, *kernel))
    w = _flip(imp, node, [w, list(range(2, 2 + n))], {})
    return imp.emit("conv", [x, w] + ([b] if b is not None else []), stride=(1,) * n, padding=(0,) * n,
                    dilation=dilation, groups=groups)  # fmt: skip


def _pool_attrs(args: list, n: int, start: int = 1) -> tuple[tuple[int, ...], ...]:
    kernel = _ints(args[start], n)
    stride = args[start + 1] if len(args) > start + 1 and args[start + 1] else kernel
    padding = args[start + 2] if len(args) > start + 2 else 0
    return kernel, _ints(stride, n), _ints(padding, n)


def _max_pool(n: int) -> Callable:
    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> tuple:
        kernel, stride, padding = _pool_attrs(args, n)
        dilation = _ints(args[4] if len(args) > 4 else 1, n)
        ceil = bool(args[5]) if len(args) > 5 else False
        y = imp.emit("max_pool", [args[0]], kernel=kernel, stride=stride, padding=padding, dilation=dilation,
                     ceil_mode=ceil)  # fmt: skip
        imp.check(node, y)
        return (y, Absent("max pooling's indices"))

    return convert


def _avg_pool(n: int) -> Callable:
    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
        kernel, stride, padding = _pool_attrs(args, n)
        ceil = bool(args[4]) if len(args) > 4 else False
        include = bool(args[5]) if len(args) > 5 else True
        divisor = args[6] if len(args) > 6 and args[6] is not None else 0
        return imp.emit("avg_pool", [args[0]], kernel=kernel, stride=stride, padding=padding, ceil_mode=ceil,
                        count_include_pad=include, divisor=int(divisor))  # fmt: skip

    return convert


def _adaptive_pool(op: str) -> Callable:
    """Adaptive pooling: a pool whose kernel is the input / output ratio where that divides; else bin
    i of an axis of n to o covers [floor(i n / o), ceil((i + 1) n / o)), and a box's mean or max is
    taken one axis at a time (a box is a product of intervals), one slice and reduction per bin."""

    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> Any:
        x = args[0]
        out = imp.out_type(node).shape
        n = len(args[1])
        rank = imp.types[x].rank
        sizes = [int(s) for s in imp.types[x].shape[-n:]]
        outs = [int(o) for o in out[-n:]]
        if not any(s % o for s, o in zip(sizes, outs, strict=True)):
            kernel = tuple(s // o for s, o in zip(sizes, outs, strict=True))
            pool = "avg_pool" if op == "reduce_mean" else "max_pool"
            y = imp.emit(pool, [x], kernel=kernel, stride=kernel, padding=(0,) * n)
        else:
            y = x
            for axis, size, o in zip(range(rank - n, rank), sizes, outs, strict=True):
                if size == o:
                    continue
                bins = []
                for i in range(o):
                    lo, hi = (i * size) // o, -((-(i + 1) * size) // o)
                    piece = (
                        imp.emit("slice", [y], "bin", axis=axis, start=lo, end=hi) if hi - lo < size else y
                    )
                    bins.append(imp.emit(op, [piece], "bin", axes=(axis,), keepdims=True))
                y = bins[0] if o == 1 else imp.emit("concat", bins, "bins", axis=axis)
        if op == "reduce_max":
            imp.check(node, y)
            return (y, Absent("adaptive max pooling's indices"))
        return y

    return convert


def _upsample(mode: str, n: int) -> Callable:
    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
        x = args[0]
        out = imp.out_type().shape
        size = tuple(int(s) for s in out[-n:])
        align = bool(args[2]) if mode == "linear" and len(args) > 2 and args[2] is not None else False
        scales = (
            args[-1]
            if isinstance(args[-1], list | tuple) and args[-1] and isinstance(args[-1][0], float)
            else None
        )
        if scales:
            sizes_in = imp.types[x].shape[-n:]
            if any(abs(1.0 / s - i / o) > 1e-12 for s, i, o in zip(scales, sizes_in, size, strict=True)):
                # torch maps output to input positions by the factor, not by the sizes' ratio: the
                # resize op's coordinates would differ, so each axis is a matmul with the weights
                # torch's own interpolation gives an identity matrix (nearest and linear are separable)
                return _resize_by_weights(imp, x, mode, align, scales)
        return imp.emit("resize", [x], size=size, mode=mode, align_corners=align)

    return convert


def _resize_by_weights(imp: Importer, x: str, mode: str, align: bool, scales: Sequence[float]) -> str:
    t = imp.types[x]
    n = len(scales)
    dtype = imp.out_type().dtype
    y = imp.operand(x, dtype)
    for k, scale in enumerate(scales):
        axis = t.rank - n + k
        size = int(imp.types[y].shape[axis])
        eye = torch.eye(size)[None]  # [1, in, in]: row i is input position i alone
        with torch.no_grad():
            if mode == "nearest":
                w = torch.nn.functional.interpolate(eye, scale_factor=float(scale), mode="nearest")
            else:
                w = torch.nn.functional.interpolate(
                    eye, scale_factor=float(scale), mode="linear", align_corners=align
                )
        weights = imp.materialize(w[0], dtype, "resize")  # [in, out]
        last = t.rank - 1
        if axis != last:
            perm = list(range(t.rank))
            perm[axis], perm[last] = last, axis
            y = imp.emit("transpose", [y], "axis_last", perm=tuple(perm))
        y = imp.emit("matmul", [y, weights], "resize")
        if axis != last:
            y = imp.emit("transpose", [y], "axis_back", perm=tuple(perm))
    return y


def _layer_norm(imp: Importer, node: Any, args: list, kwargs: dict) -> tuple:
    x, shape, w, b, eps = args[:5]
    dtype = imp.out_type().dtype
    params = [imp.operand(p, dtype) for p in (w, b) if p is not None]
    if len(shape) == 1 and w is not None and b is not None:
        y = imp.emit("layernorm", [x, *params], eps=float(eps))
    else:
        if w is None and b is not None:
            params = [imp.materialize(torch.ones(tuple(shape)), dtype, "w"), *params]
        y = imp.emit("layer_norm", [x, *params], dims=len(shape), eps=float(eps))
    imp.check(node, y)
    return (y, Absent("layer norm's mean"), Absent("layer norm's rstd"))


def _group_norm(imp: Importer, node: Any, args: list, kwargs: dict) -> tuple:
    x, w, b, _, c, _, groups, eps = args[:8]
    dtype = imp.out_type().dtype
    if w is None and b is not None:
        w = torch.ones(c)
    params = [imp.operand(p, dtype) for p in (w, b) if p is not None]
    y = imp.emit("group_norm", [x, *params], groups=int(groups), eps=float(eps))
    imp.check(node, y)
    return (y, Absent("group norm's mean"), Absent("group norm's rstd"))


def _batch_norm(imp: Importer, node: Any, args: list, kwargs: dict) -> tuple:
    x, w, b, mean, var, _, eps = args[:7]
    c = imp.types[x].shape[1]
    dtype = imp.out_type().dtype
    w = torch.ones(c) if w is None else w
    b = torch.zeros(c) if b is None else b
    y = imp.emit("batch_norm", [x, *(imp.operand(p, dtype) for p in (w, b, mean, var))], eps=float(eps))
    imp.check(node, y)
    return (y, Absent("batch norm's saved mean"), Absent("batch norm's saved rstd"))


def _embedding(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    return imp.emit("embedding", [args[0], args[1]])


def _index_select(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x, dim, idx = args
    return imp.emit("index_select", [x, imp.operand(idx, DType.I64)], axis=int(dim))


def _gather(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x, dim, idx = args[:3]
    return imp.emit("gather", [x, imp.operand(idx, DType.I64)], axis=int(dim))


def _scatter_add(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x, dim, idx, src = args
    dtype = imp.out_type().dtype
    return imp.emit("scatter_add", [imp.operand(x, dtype), imp.operand(idx, DType.I64), imp.operand(src, dtype)],
                    axis=int(dim))  # fmt: skip


def _scatter_reduce(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    """scatter_reduce: sum and mean through scatter_add (and a count of each position's sources),
    amax and amin through scatter_max and scatter_min; include_self=False keeps x where no source
    lands and leaves it out of the reduction elsewhere."""
    x, dim, idx, src, reduce = args[:5]
    include_self = bool(kwargs.get("include_self", args[5] if len(args) > 5 else True))
    dtype = imp.out_type().dtype
    x, idx, src = imp.operand(x, dtype), imp.operand(idx, DType.I64), imp.operand(src, dtype)
    t = imp.types[x]
    axis = int(dim) % t.rank
    if reduce not in ("sum", "mean", "amax", "amin"):
        raise Unsupported(f"node `{node.name}`: scatter_reduce `{reduce}` (sum, mean, amax and amin import)")
    if reduce == "mean" and not dtype.is_float:
        raise Unsupported(f"node `{node.name}`: scatter_reduce mean on integers (floor division)")

    def full(value: float, shape: Sequence[int]) -> str:
        one = imp.reshape(imp.materialize(value, dtype, "fill"), (1,) * len(shape))
        return imp.emit("expand", [one], "fill", shape=tuple(int(d) for d in shape))

    shape = tuple(int(d) for d in t.shape)
    count = None
    if reduce == "mean" or not include_self:
        ones = full(1.0, imp.types[idx].shape)
        count = imp.emit("scatter_add", [full(0.0, shape), idx, ones], "count", axis=axis)
    if reduce in ("sum", "mean"):
        y = imp.emit("scatter_add", [x if include_self else full(0.0, shape), idx, src], "sum", axis=axis)
        if reduce == "mean":
            n = imp.emit("add", [count, imp.materialize(1.0, dtype, "self")], "n") if include_self else (
                imp.emit("maximum", [count, imp.materialize(1.0, dtype, "one")], "n"))  # fmt: skip
            y = imp.emit("div", [y, n], "mean")
    else:
        op = "scatter_max" if reduce == "amax" else "scatter_min"
        if include_self:
            base = x
        else:
            info = torch.finfo if dtype.is_float else torch.iinfo
            lowest, highest = (-float("inf"), float("inf")) if dtype.is_float else (
                info(IR_TO_TORCH[dtype]).min, info(IR_TO_TORCH[dtype]).max)  # fmt: skip
            base = full(lowest if reduce == "amax" else highest, shape)
        y = imp.emit(op, [base, idx, src], "reduce", axis=axis)
    if include_self:
        return y
    landed = imp.emit("gt", [count, imp.materialize(0.0, dtype, "zero")], "landed")
    return imp.emit("where", [landed, y, x])


def _index_add(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x, dim, idx, src = args[:4]
    alpha = kwargs.get("alpha", args[4] if len(args) > 4 else 1)
    dtype = imp.out_type().dtype
    src = imp.operand(src, dtype)
    if alpha != 1:
        src = imp.emit("mul", [src, imp.materialize(alpha, dtype, "alpha")], "alpha")
    return imp.emit("index_add", [imp.operand(x, dtype), imp.operand(idx, DType.I64), src], axis=int(dim))


def _single_index(node: Any, indices: Sequence[Any]) -> tuple[int, Any]:
    present = [(i, v) for i, v in enumerate(indices) if v is not None]
    if len(present) != 1:
        raise Unsupported(f"node `{node.name}` ({node.target}): indexing with {len(present)} index tensors "
                          "(one is imported: index_select / index_add)")  # fmt: skip
    return present[0]


def _merged_index(imp: Importer, node: Any, x: str, indices: Sequence[Any]) -> tuple:
    """torch's advanced indexing x[i0, i1, ...] (index tensors broadcast together) as one index into
    one dim: the indexed dims (moved to the front first when not adjacent, where torch puts their
    result) merged, and the indices combined into a linear index (each wrapped: negative counts from
    the end). Returns (merged x, its indexed axis, the flat index, the index's broadcast shape, the
    permutation applied to x or None)."""
    present = [i for i, v in enumerate(indices) if v is not None]
    t = imp.types[x]
    if any(isinstance(indices[i], str) and imp.types[indices[i]].dtype == DType.BOOL for i in present):
        raise Unsupported(f"node `{node.name}` ({node.target}): boolean-mask indexing (data-dependent shape)")
    perm = None
    if present != list(range(present[0], present[-1] + 1)):
        perm = (*present, *(d for d in range(t.rank) if d not in present))
        x = imp.emit("transpose", [x], "front", perm=perm)
        indices = [indices[i] for i in present]
        present = list(range(len(present)))
        t = imp.types[x]
    first, k = present[0], len(present)
    sizes = [int(d) for d in t.shape[first : first + k]]
    idx = [imp.operand(indices[i], DType.I64) for i in present]
    shape = tuple(int(d) for d in np.broadcast_shapes(*(tuple(imp.types[v].shape) for v in idx)))
    linear = None
    strides = np.cumprod([1, *sizes[::-1]])[-2::-1]
    for v, size, stride in zip(idx, sizes, strides, strict=True):
        v = imp.emit("remainder", [v, imp.materialize(size, DType.I64, "size")], "wrap")
        if stride != 1:
            v = imp.emit("mul", [v, imp.materialize(int(stride), DType.I64, "stride")], "stride")
        linear = v if linear is None else imp.emit("add", [linear, v], "linear")
    if tuple(imp.types[linear].shape) != shape:
        linear = _expand(imp, node, [linear], {}, shape)
    flat = imp.reshape(linear, (int(np.prod(shape)),))
    merged = imp.reshape(x, (*t.shape[:first], int(np.prod(sizes)), *t.shape[first + k :]))
    return merged, first, flat, shape, perm


def _index_put(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x, indices, values = args[:3]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    dtype = imp.out_type().dtype
    x = imp.operand(x, dtype)
    t = imp.types[x]
    present = [v for v in indices if v is not None]
    mask = present[0] if len(present) == 1 and isinstance(present[0], str) else None
    if mask is not None and imp.types[mask].dtype == DType.BOOL:
        # x[mask] = v with a scalar v: where(mask, v, x), the mask over x's leading dims
        if accumulate or int(np.prod(imp.types[values].shape if isinstance(values, str) else ())) != 1:
            raise Unsupported(f"node `{node.name}`: a boolean-mask index_put of a non-scalar value or with "
                              "accumulate (data-dependent shape)")  # fmt: skip
        m = imp.reshape(mask, (*imp.types[mask].shape, *(1,) * (t.rank - imp.types[mask].rank)))
        v = imp.reshape(imp.operand(values, dtype), ())
        return imp.emit("where", [m, v, x])
    if not accumulate:
        raise Unsupported(
            f"node `{node.name}`: index_put without accumulate (x[index] = v with an index tensor: which "
            "duplicate wins is undefined) is outside the op set; index_add or scatter_add imports"
        )
    merged, axis, flat, shape, perm = _merged_index(imp, node, x, indices)
    mt = imp.types[merged]
    want = (*mt.shape[:axis], *shape, *mt.shape[axis + 1 :])
    src = imp.operand(values, dtype)
    if tuple(imp.types[src].shape) != want:
        src = imp.reshape(src, (1,) * (len(want) - imp.types[src].rank) + tuple(imp.types[src].shape))
        src = imp.emit("expand", [src], "expand", shape=want)
    src = imp.reshape(src, (*mt.shape[:axis], int(np.prod(shape)), *mt.shape[axis + 1 :]))
    y = imp.emit("index_add", [merged, flat, src], "put", axis=axis)
    if perm is None:
        return imp.reshape(y, t.shape)
    y = imp.reshape(y, tuple(int(t.shape[d]) for d in perm))
    return imp.emit("transpose", [y], perm=tuple(int(i) for i in np.argsort(perm)))


def _index_many(imp: Importer, node: Any, x: str, indices: Sequence[Any]) -> str:
    merged, axis, flat, _, _ = _merged_index(imp, node, x, indices)
    y = imp.emit("index_select", [merged, flat], axis=axis)
    return imp.reshape(y, imp.out_type().shape)


def _index(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x, indices = args
    if sum(v is not None for v in indices) > 1:
        return _index_many(imp, node, x, indices)
    axis, idx = _single_index(node, indices)
    idx_v = (
        imp.operand(idx, DType.I64)
        if not (isinstance(idx, str) and imp.types[idx].dtype == DType.BOOL)
        else None
    )
    if idx_v is None:
        raise Unsupported(f"node `{node.name}`: boolean-mask indexing (data-dependent shape)")
    it = imp.types[idx_v]
    flat = imp.reshape(idx_v, (int(np.prod(it.shape)),)) if it.rank != 1 else idx_v
    y = imp.emit("index_select", [x, flat], axis=axis)
    return imp.reshape(y, imp.out_type().shape)


def _cat(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    tensors = args[0]
    dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
    dtype = imp.out_type().dtype
    values = [imp.operand(t, dtype) for t in tensors]
    values = [v for v in values if 0 not in imp.types[v].shape]  # torch.cat skips empty operands
    if len(values) == 1:
        return values[0]
    return imp.emit("concat", values, axis=int(dim) % imp.types[values[0]].rank)


def _slice_bounds(size: int, start: Any, end: Any) -> tuple[int, int]:
    start = 0 if start is None else int(start)
    end = size if end is None else int(end)
    lo, hi, _ = slice(start, end).indices(size)
    return lo, max(hi, lo)


def _slice(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x = args[0]
    dim = int(args[1]) if len(args) > 1 else 0
    t = imp.types[x]
    dim %= t.rank
    lo, hi = _slice_bounds(
        int(t.shape[dim]), args[2] if len(args) > 2 else None, args[3] if len(args) > 3 else None
    )
    step = int(args[4]) if len(args) > 4 else 1
    if lo == 0 and hi == t.shape[dim] and step == 1:
        return x
    if hi <= lo:
        raise Unsupported(f"node `{node.name}`: an empty slice")
    if step == 1:
        return imp.emit("slice", [x], axis=dim, start=lo, end=hi)
    return imp.emit("strided_slice", [x], axis=dim, start=lo, end=hi, step=step)


def _select(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x, dim, index = args
    t = imp.types[x]
    dim %= t.rank
    index %= int(t.shape[dim])
    y = imp.emit("slice", [x], "select", axis=dim, start=index, end=index + 1)
    return imp.reshape(y, imp.out_type().shape)


def _view(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    return imp.reshape(args[0], imp.out_type().shape)


def _permute(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x = args[0]
    rank = imp.types[x].rank
    perm = tuple(int(p) % rank for p in args[1])
    if perm == tuple(range(rank)):
        return x
    return imp.emit("transpose", [x], perm=perm)


def _transpose(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x = args[0]
    rank = imp.types[x].rank
    a, b = (int(args[1]) % rank, int(args[2]) % rank) if len(args) > 1 else (0, 1)
    perm = list(range(rank))
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(imp, node, [x, perm], {})


def _expand(imp: Importer, node: Any, args: list, kwargs: dict, shape: Sequence[int] | None = None) -> str:
    x = args[0]
    out = imp.out_type().shape if shape is None else tuple(shape)
    t = imp.types[x]
    if tuple(t.shape) == tuple(out):
        return x
    x = imp.reshape(x, (1,) * (len(out) - t.rank) + tuple(t.shape))
    if tuple(imp.types[x].shape) == tuple(out):
        return x
    return imp.emit("expand", [x], shape=out)


def _repeat(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x, reps = args[0], [int(r) for r in args[1]]
    t = imp.types[x]
    shape = (1,) * (len(reps) - t.rank) + tuple(int(d) for d in t.shape)
    x = imp.reshape(x, shape)
    # tile: [r0, d0, r1, d1, ...] broadcast, then merged pairwise
    inter = tuple(v for d in shape for v in (1, d))
    big = tuple(v for r, d in zip(reps, shape, strict=True) for v in (r, d))
    x = imp.reshape(x, inter)
    if big != inter:
        x = imp.emit("expand", [x], "tile", shape=big)
    return imp.reshape(x, imp.out_type().shape)


def _diagonal(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    """x.diagonal(offset, dim1, dim2): the two dims moved last and merged, then the diagonal's
    positions picked by index_select; torch puts the diagonal's dim last."""
    x = args[0]
    offset = int(kwargs.get("offset", args[1] if len(args) > 1 else 0))
    t = imp.types[x]
    d1 = int(kwargs.get("dim1", args[2] if len(args) > 2 else 0)) % t.rank
    d2 = int(kwargs.get("dim2", args[3] if len(args) > 3 else 1)) % t.rank
    n, m = int(t.shape[d1]), int(t.shape[d2])
    rows = np.arange(max(0, -offset), n)
    rows = rows[rows + offset < m]
    if rows.size == 0:
        raise Unsupported(f"node `{node.name}`: an empty diagonal")
    rest = [d for d in range(t.rank) if d not in (d1, d2)]
    y = imp.emit("transpose", [x], "last", perm=(*rest, d1, d2))
    y = imp.reshape(y, (*(int(t.shape[d]) for d in rest), n * m))
    pick = imp.materialize(torch.from_numpy(rows * m + rows + offset), DType.I64, "diagonal")
    return imp.emit("index_select", [y, pick], axis=len(rest))


def _identity(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    return args[0]


def _to_copy(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    return imp.operand(args[0], imp.out_type().dtype)


def _copy(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    dst, src = args[:2]
    out = imp.out_type()
    src = imp.operand(src, out.dtype)
    return _expand(imp, node, [src], {})


def _slice_scatter(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x, src = args[:2]
    dim = int(kwargs.get("dim", args[2] if len(args) > 2 else 0))
    dtype = imp.out_type().dtype
    x, src = imp.operand(x, dtype), imp.operand(src, dtype)
    t = imp.types[x]
    dim %= t.rank
    lo, hi = _slice_bounds(int(t.shape[dim]), kwargs.get("start", args[3] if len(args) > 3 else None),
                           kwargs.get("end", args[4] if len(args) > 4 else None))  # fmt: skip
    step = int(kwargs.get("step", args[5] if len(args) > 5 else 1))
    return imp.emit("slice_scatter", [x, src], axis=dim, start=lo, end=hi, step=step)


def _select_scatter(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x, src, dim, index = args
    dtype = imp.out_type().dtype
    x = imp.operand(x, dtype)
    t = imp.types[x]
    dim %= t.rank
    index %= int(t.shape[dim])
    src = imp.reshape(imp.operand(src, dtype), (*t.shape[:dim], 1, *t.shape[dim + 1 :]))
    return imp.emit("slice_scatter", [x, src], axis=dim, start=index, end=index + 1, step=1)


def _unfold(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x, dim, size, step = args
    t = imp.types[x]
    dim %= t.rank
    count = (int(t.shape[dim]) - size) // step + 1
    pieces = []
    for i in range(count):  # window i as [*, 1, size, *] along dim
        s = imp.emit("slice", [x], "window", axis=dim, start=i * step, end=i * step + size)
        pieces.append(imp.reshape(s, (*t.shape[:dim], 1, size, *t.shape[dim + 1 :])))
    y = pieces[0] if count == 1 else imp.emit("concat", pieces, "windows", axis=dim)
    perm = [*range(dim + 1), *range(dim + 2, t.rank + 1), dim + 1]  # the window's axis goes last
    return imp.emit("transpose", [y], perm=tuple(perm))


def _constant_pad(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x, pad = args[0], list(args[1])
    value = args[2] if len(args) > 2 else 0
    if any(p < 0 for p in pad):  # a negative amount crops: slice those first, then pad the rest
        rank = imp.types[x].rank
        for i in range(len(pad) // 2):
            axis, left, right = rank - 1 - i, int(pad[2 * i]), int(pad[2 * i + 1])
            size = int(imp.types[x].shape[axis])
            lo, hi = max(-left, 0), size - max(-right, 0)
            if lo or hi != size:
                x = imp.emit("slice", [x], "crop", axis=axis, start=lo, end=hi)
        pad = [max(int(p), 0) for p in pad]
        if not any(pad):
            return x
    out = imp.out_type()
    y = imp.materialize(torch.full(out.shape, value, dtype=IR_TO_TORCH[out.dtype]), out.dtype, "pad")
    t = imp.types[x]
    # pad lists (left, right) pairs from the last dim backwards: x goes into the filled box at the lefts
    starts = {t.rank - 1 - i: int(pad[2 * i]) for i in range(len(pad) // 2)}
    return _scatter_box(imp, y, x, starts)


def _scatter_box(imp: Importer, box: str, x: str, starts: dict[int, int]) -> str:
    """`x` written into `box` at offsets `starts` (axis -> offset), one slice_scatter per axis."""
    bt, xt = imp.types[box], imp.types[x]
    axes = sorted(a for a in starts if starts[a] or xt.shape[a] != bt.shape[a])
    if not axes:
        return x

    # Innermost first: build the slab of box that x's region spans on the other axes.
    def region(value: str, upto: int) -> str:
        for a in axes[:upto]:
            value = imp.emit(
                "slice", [value], "pad", axis=a, start=starts[a], end=starts[a] + int(xt.shape[a])
            )
        return value

    inner = x
    for k in reversed(range(len(axes))):
        a = axes[k]
        outer = region(box, k)
        start = starts[a]
        inner = imp.emit(
            "slice_scatter", [outer, inner], "pad", axis=a, start=start, end=start + int(xt.shape[a])
        )
    return inner


def _leaky_relu(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x = args[0]
    slope = kwargs.get("negative_slope", args[1] if len(args) > 1 else 0.01)
    dtype = imp.out_type().dtype
    positive = imp.emit("gt", [x, imp.materialize(0.0, dtype, "zero")], "positive")
    scaled = imp.emit("mul", [x, imp.materialize(slope, dtype, "slope")], "slope")
    return imp.emit("where", [positive, x, scaled])


def _rrelu(imp: Importer, node: Any, args: list, kwargs: dict) -> tuple:
    # inference: a leaky relu of the mean slope; training draws random slopes
    lower = float(kwargs.get("lower", args[2] if len(args) > 2 else 1 / 8))
    upper = float(kwargs.get("upper", args[3] if len(args) > 3 else 1 / 3))
    if bool(kwargs.get("training", args[4] if len(args) > 4 else False)):
        raise Unsupported(f"node `{node.name}`: rrelu in training mode draws random slopes")
    y = _leaky_relu(imp, node, [args[0], (lower + upper) / 2], {})
    return (y, Absent("rrelu's noise"))


def _elu(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    # elu(x) = scale * (x if x > 0 else alpha * expm1(x * input_scale)); selu and celu decompose to it
    x = args[0]
    alpha, scale, input_scale = (float(args[i]) if len(args) > i else 1.0 for i in (1, 2, 3))
    dtype = imp.out_type().dtype
    positive = imp.emit("gt", [x, imp.materialize(0.0, dtype, "zero")], "positive")
    inner = x if input_scale == 1.0 else imp.emit("mul", [x, imp.materialize(input_scale, dtype, "s")], "s")
    neg = imp.emit("expm1", [inner], "expm1")
    if alpha != 1.0:
        neg = imp.emit("mul", [neg, imp.materialize(alpha, dtype, "alpha")], "alpha")
    y = imp.emit("where", [positive, x, neg], "elu")
    return y if scale == 1.0 else imp.emit("mul", [y, imp.materialize(scale, dtype, "scale")])


def _exp2(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    dtype = imp.out_type().dtype
    return imp.emit("pow", [imp.materialize(2.0, dtype, "two"), imp.operand(args[0], dtype)])


def _log2(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    dtype = imp.out_type().dtype
    y = imp.emit("log", [imp.operand(args[0], dtype)], "log")
    return imp.emit("mul", [y, imp.materialize(1.0 / np.log(2.0), dtype, "log2e")])


def _isinf(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x = args[0]
    dtype = imp.types[x].dtype
    if not dtype.is_float:
        return imp.emit("ne", [x, x])  # integers are never infinite: all False
    return imp.emit("eq", [imp.emit("abs", [x], "abs"), imp.materialize(float("inf"), dtype, "inf")])


def _bitwise_not(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    if imp.types[args[0]].dtype != DType.BOOL:
        raise Unsupported(
            f"node `{node.name}` ({node.target}) on integers: bitwise ops are outside the op set"
        )
    return imp.emit("logical_not", [args[0]])


def _fmod(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    # fmod(a, b) = a - trunc(a / b) * b (the sign of a; remainder takes the sign of b)
    dtype = imp.out_type().dtype
    if not dtype.is_float:
        raise Unsupported(f"node `{node.name}`: integer fmod (truncating division) is outside the op set")
    a, b = imp.operand(args[0], dtype), imp.operand(args[1], dtype)
    q = imp.emit("trunc", [imp.emit("div", [a, b], "div")], "trunc")
    return imp.emit("sub", [a, imp.emit("mul", [q, b], "mul")])


def _round_decimals(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    # torch: round(x * 10**d) / 10**d, half to even
    decimals = int(kwargs.get("decimals", args[1] if len(args) > 1 else 0))
    dtype = imp.out_type().dtype
    x = imp.operand(args[0], dtype)
    if decimals == 0:
        return imp.emit("round", [x])
    scale = imp.materialize(10.0**decimals, dtype, "scale")
    y = imp.emit("round", [imp.emit("mul", [x, scale], "scale")], "round")
    return imp.emit("div", [y, scale])


def _hardtanh(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    lo = kwargs.get("min_val", args[1] if len(args) > 1 else -1.0)
    hi = kwargs.get("max_val", args[2] if len(args) > 2 else 1.0)
    return _clamp(imp, node, [args[0], lo, hi], {})


def _flip(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x = args[0]
    t = imp.types[x]
    for d in sorted({int(d) % t.rank for d in args[1]}):
        n = int(t.shape[d])
        if n > 1:  # index_select with the reversed positions
            rev = imp.materialize(torch.arange(n - 1, -1, -1), DType.I64, "reversed")
            x = imp.emit("index_select", [x, rev], "flip", axis=d)
    return x


def _split_with_sizes(imp: Importer, node: Any, args: list, kwargs: dict) -> tuple:
    x, sizes = args[0], [int(s) for s in args[1]]
    t = imp.types[x]
    dim = int(kwargs.get("dim", args[2] if len(args) > 2 else 0)) % t.rank
    pieces, start = [], 0
    for size in sizes:
        if size == int(t.shape[dim]):
            pieces.append(x)
        else:
            pieces.append(imp.emit("slice", [x], "split", axis=dim, start=start, end=start + size))
        start += size
    return tuple(pieces)


def _vector_norm(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
    x = args[0]
    ord_ = float(kwargs.get("ord", args[1] if len(args) > 1 else 2))
    dims = kwargs.get("dim", args[2] if len(args) > 2 else None)
    keep = bool(kwargs.get("keepdim", args[3] if len(args) > 3 else False))
    dtype = imp.out_type().dtype
    x = imp.operand(x, dtype)
    rank = imp.types[x].rank
    axes = _dims(dims, rank) or tuple(range(rank))
    a = imp.emit("abs", [x], "abs")
    if ord_ == float("inf"):
        return imp.emit("reduce_max", [a], axes=axes, keepdims=keep)
    if ord_ == float("-inf"):
        return imp.emit("reduce_min", [a], axes=axes, keepdims=keep)
    if ord_ == 0.0:
        nz = imp.emit(
            "cast", [imp.emit("ne", [x, imp.materialize(0.0, dtype, "zero")], "nz")], "nz", dtype=dtype.value
        )
        return imp.emit("reduce_sum", [nz], axes=axes, keepdims=keep)
    if ord_ == 1.0:
        return imp.emit("reduce_sum", [a], axes=axes, keepdims=keep)
    if ord_ == 2.0:
        s = imp.emit("reduce_sum", [imp.emit("mul", [a, a], "square")], "sum", axes=axes, keepdims=keep)
        return imp.emit("sqrt", [s])
    p = imp.emit("pow", [a, imp.materialize(ord_, dtype, "ord")], "pow")
    s = imp.emit("reduce_sum", [p], "sum", axes=axes, keepdims=keep)
    return imp.emit("pow", [s, imp.materialize(1.0 / ord_, dtype, "inv_ord")])


def _batch_norm_batch_stats(imp: Importer, node: Any, args: list, kwargs: dict) -> tuple:
    """Batch norm over the batch's own statistics (`no_stats`: instance norm, or a norm in training
    mode): per channel over N and every spatial dim, as a group norm with one group per channel on
    [1, C, N * S]."""
    x, w, b = args[:3]
    eps = float(args[-1])
    t = imp.types[x]
    dtype = imp.out_type().dtype
    n, c = int(t.shape[0]), int(t.shape[1])
    spatial = int(np.prod(t.shape[2:])) if t.rank > 2 else 1
    y = x
    if n > 1:
        y = imp.emit("transpose", [y], "nc", perm=(1, 0, *range(2, t.rank)))
    y = imp.reshape(y, (1, c, n * spatial))
    w = torch.ones(c) if w is None and b is not None else w
    params = [imp.operand(p, dtype) for p in (w, b) if p is not None]
    y = imp.emit("group_norm", [y, *params], "norm", groups=c, eps=eps)
    if n > 1:
        y = imp.reshape(y, (c, n, *t.shape[2:]))
        y = imp.emit("transpose", [y], "back", perm=(1, 0, *range(2, t.rank)))
    y = imp.reshape(y, t.shape)
    imp.check(node, y)
    return (y, Absent("batch norm's saved mean"), Absent("batch norm's saved rstd"))


def _unary_op(op: str) -> Callable:
    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
        return imp.emit(op, [args[0]])

    return convert


def _fft(op: str) -> Callable:
    def convert(imp: Importer, node: Any, args: list, kwargs: dict) -> str:
        x, dim, norm, last = args[:4]
        rank = imp.types[x].rank
        axes = tuple(int(d) % rank for d in dim)
        names = {0: "none", 1: "sqrt", 2: "n"}
        if op == "fft_r2c":
            return imp.emit(
                op, [imp.operand(x, DType.F32)], axes=axes, norm=names[int(norm)], onesided=bool(last)
            )
        if op == "fft_c2r":
            return imp.emit(op, [x], axes=axes, norm=names[int(norm)], last_size=int(last))
        return imp.emit(op, [x], axes=axes, norm=names[int(norm)], forward=bool(last))

    return convert


COMPLEX_SUPPORT = (
    "outside the op set (complex values import through add, sub, mul, div, abs, neg, conj, sum, mean, "
    "where, matmul, FFT, view_as_real/complex, and layout ops)"
)
# The IR ops that take complex64 operands; complex arithmetic is imported as real arithmetic on the parts.
COMPLEX_OPS = frozenset({"cmatmul", "fft_c2c", "fft_c2r", "view_as_real", "reshape", "transpose", "slice",
                         "strided_slice", "concat", "expand", "slice_scatter", "index_select"})  # fmt: skip
SKIP = frozenset({"aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
                  "aten.sym_constrain_range_for_size.default", "aten._assert_async.msg"})  # fmt: skip
# Ops whose result depends only on their tensor arguments' shapes and dtypes: always constants.
SHAPE_ONLY = frozenset({"aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default",
                        "aten.empty_like.default", "aten.scalar_tensor.default", "aten.full.default",
                        "aten.arange.start_step", "aten.arange.default", "aten.empty.memory_format",
                        "aten.zeros.default", "aten.ones.default"})  # fmt: skip

_UNARY = ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "sigmoid", "relu", "erf",
          "reciprocal", "floor", "ceil", "round", "trunc", "sign", "log1p", "expm1", "silu", "logical_not"]  # fmt: skip

CONVERT: dict[str, Callable[..., Any]] = {
    **{f"aten.{op}.default": _unary(op) for op in _UNARY},
    "aten.gelu.default": _gelu,
    "aten.add.Tensor": _binary("add", alpha=True), "aten.add.Scalar": _binary("add", alpha=True),
    "aten.sub.Tensor": _binary("sub", alpha=True), "aten.sub.Scalar": _binary("sub", alpha=True),
    "aten.rsub.Scalar": _binary("sub", reverse=True), "aten.rsub.Tensor": _binary("sub", reverse=True),
    "aten.mul.Tensor": _binary("mul"), "aten.mul.Scalar": _binary("mul"),
    "aten.div.Tensor": _binary("div"), "aten.div.Scalar": _binary("div"),
    "aten.div.Tensor_mode": _div_mode, "aten.div.Scalar_mode": _div_mode,
    "aten.pow.Tensor_Scalar": _binary("pow"), "aten.pow.Tensor_Tensor": _binary("pow"),
    "aten.pow.Scalar": _binary("pow"),
    "aten.maximum.default": _binary("maximum"), "aten.minimum.default": _binary("minimum"),
    "aten.remainder.Tensor": _binary("remainder"), "aten.remainder.Scalar": _binary("remainder"),
    "aten.clamp.default": _clamp, "aten.clamp.Tensor": _clamp,
    "aten.clamp_min.default": _clamp_side("maximum"), "aten.clamp_max.default": _clamp_side("minimum"),
    "aten.logical_and.default": _logical("logical_and"), "aten.logical_or.default": _logical("logical_or"),
    "aten.logical_xor.default": _logical("logical_xor"),
    "aten.bitwise_and.Tensor": _logical("logical_and", True), "aten.bitwise_or.Tensor": _logical("logical_or", True),
    "aten.bitwise_xor.Tensor": _logical("logical_xor", True),
    **{f"aten.{op}.{kind}": _compare(op) for op in ("eq", "ne", "lt", "le", "gt", "ge") for kind in ("Tensor", "Scalar")},
    "aten.where.self": _where,
    "aten.sum.dim_IntList": _reduce("reduce_sum"), "aten.sum.default": _reduce("reduce_sum", None, None),
    "aten.mean.dim": _reduce("reduce_mean"), "aten.mean.default": _reduce("reduce_mean", None, None),
    "aten.amax.default": _reduce("reduce_max"), "aten.amin.default": _reduce("reduce_min"),
    "aten.prod.dim_int": _reduce("reduce_prod"), "aten.prod.default": _reduce("reduce_prod", None, None),
    "aten.any.dim": _reduce("reduce_any"), "aten.any.dims": _reduce("reduce_any"),
    "aten.any.default": _reduce("reduce_any", None, None),
    "aten.all.dim": _reduce("reduce_all"), "aten.all.default": _reduce("reduce_all", None, None),
    "aten.var.correction": _var, "aten.var_mean.correction": _var_mean, "aten.argmax.default": _argmax, "aten.argmin.default": _argmin,
    "aten.max.dim": _max_dim("reduce_max"), "aten.min.dim": _max_dim("reduce_min"),
    "aten.max.default": _reduce("reduce_max", None, None), "aten.min.default": _reduce("reduce_min", None, None),
    "aten.cumsum.default": _cumsum,
    "aten._softmax.default": _softmax("softmax"), "aten._log_softmax.default": _softmax("log_softmax"),
    "aten.mm.default": _mm, "aten.bmm.default": _mm, "aten.addmm.default": _addmm,
    "aten.convolution.default": _convolution,
    "aten.max_pool2d_with_indices.default": _max_pool(2), "aten.max_pool3d_with_indices.default": _max_pool(3),
    "aten.avg_pool1d.default": _avg_pool(1), "aten.avg_pool2d.default": _avg_pool(2),
    "aten.avg_pool3d.default": _avg_pool(3),
    "aten._adaptive_avg_pool2d.default": _adaptive_pool("reduce_mean"),
    "aten._adaptive_avg_pool3d.default": _adaptive_pool("reduce_mean"),
    "aten.adaptive_max_pool2d.default": _adaptive_pool("reduce_max"),
    "aten.adaptive_max_pool3d.default": _adaptive_pool("reduce_max"),
    "aten.upsample_nearest1d.vec": _upsample("nearest", 1), "aten.upsample_nearest2d.vec": _upsample("nearest", 2),
    "aten.upsample_nearest3d.vec": _upsample("nearest", 3), "aten.upsample_linear1d.vec": _upsample("linear", 1),
    "aten.upsample_bilinear2d.vec": _upsample("linear", 2), "aten.upsample_trilinear3d.vec": _upsample("linear", 3),
    "aten.native_layer_norm.default": _layer_norm, "aten.native_group_norm.default": _group_norm,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm,
    "aten.embedding.default": _embedding, "aten.index_select.default": _index_select,
    "aten.gather.default": _gather, "aten.scatter_add.default": _scatter_add,
    "aten.scatter_reduce.two": _scatter_reduce,
    "aten.index_add.default": _index_add, "aten.index_put.default": _index_put, "aten.index.Tensor": _index,
    "aten.cat.default": _cat, "aten.slice.Tensor": _slice, "aten.select.int": _select,
    **{f"aten.{op}": _view for op in ("view.default", "_unsafe_view.default", "reshape.default", "unsqueeze.default",
                                      "squeeze.dim", "squeeze.dims", "squeeze.default", "flatten.using_ints")},
    "aten.permute.default": _permute, "aten.t.default": _transpose, "aten.transpose.int": _transpose,
    "aten.expand.default": _expand, "aten.repeat.default": _repeat, "aten.diagonal.default": _diagonal,
    **{f"aten.{op}": _identity for op in ("clone.default", "alias.default", "contiguous.default",
                                          "lift_fresh_copy.default", "detach.default")},
    "aten._to_copy.default": _to_copy, "aten.copy.default": _copy,
    "aten.slice_scatter.default": _slice_scatter, "aten.select_scatter.default": _select_scatter,
    "aten.unfold.default": _unfold, "aten.constant_pad_nd.default": _constant_pad,
    "aten._fft_r2c.default": _fft("fft_r2c"), "aten._fft_c2r.default": _fft("fft_c2r"),
    "aten._fft_c2c.default": _fft("fft_c2c"),
    "aten.leaky_relu.default": _leaky_relu, "aten.rrelu_with_noise_functional.default": _rrelu, "aten.elu.default": _elu, "aten.hardtanh.default": _hardtanh,
    "aten.exp2.default": _exp2, "aten.round.decimals": _round_decimals, "aten.log2.default": _log2, "aten.isinf.default": _isinf,
    "aten.bitwise_not.default": _bitwise_not, "aten.fmod.Scalar": _fmod, "aten.fmod.Tensor": _fmod,
    "aten.flip.default": _flip, "aten.split_with_sizes.default": _split_with_sizes,
    "aten.linalg_vector_norm.default": _vector_norm,
    "aten._native_batch_norm_legit.no_stats": _batch_norm_batch_stats,
    "aten._conj.default": _conj, "aten.conj_physical.default": _conj, "aten._conj_physical.default": _conj,
    "aten.complex.default": _complex_ctor, "aten.polar.default": _polar, "aten.hypot.default": _hypot,
    "aten._cdist_forward.default": _cdist,
    "aten.view_as_real.default": _unary_op("view_as_real"), "aten.view_as_complex.default": _unary_op("view_as_complex"),
}  # fmt: skip
