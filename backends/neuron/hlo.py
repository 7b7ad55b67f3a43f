"""From a JAX function to what neuronx-cc consumes, and the checks the module must pass.

Stages (each output is inspectable, and written by name by the backend's compile):
  stablehlo  `jax.jit(fn).lower(*abstract_args).as_text()`             -> .stablehlo.mlir
  hlo        `lowered.compiler_ir("hlo")`: `.as_hlo_text()`, `.as_serialized_hlo_module_proto()`
             -> .hlo.txt, .hlo.pb (on a JAX without compiler_ir("hlo") the StableHLO module is
             converted with `mlir_module_to_xla_computation`; both exist on JAX 0.10 and 0.11)
  check      `check_hlo(text)`: no custom call neuronx-cc does not know, no host callback or
             host transfer, no constant over MAX_CONSTANT_BYTES (weights are parameters)

Checked on JAX 0.10.2 (this machine) and 0.11.2 (the GPU image) on XLA's CPU backend; what
neuronx-cc does with the module is written against AWS's documentation and not run here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from polymorph.errors import UserError

# Custom-call targets neuronx-cc recognizes (AWS Neuron docs, compiler error code NCC_EVRF015, which
# lists them). polymorph's kernels emit none; a candidate kernel may use these (an NKI kernel
# through jax-neuronx is an AwsNeuronCustomNativeKernel call), and no others.
NEURON_CUSTOM_CALLS = frozenset(
    {
        "AwsNeuronErf",
        "AwsNeuronGelu",
        "AwsNeuronGeluApprxTanh",
        "AwsNeuronGeluBackward",
        "AwsNeuronSilu",
        "AwsNeuronSiluBackward",
        "AwsNeuronRmsNorm",
        "AwsNeuronSoftmax",
        "AwsNeuronSoftmaxBackward",
        "AwsNeuronCollectiveMatmul",
        "AwsNeuronIntMatmult",
        "AwsNeuronArgMax",
        "AwsNeuronArgMin",
        "AwsNeuronTopK",
        "AwsNeuronDropoutMaskV1",
        "AwsNeuronCustomNativeKernel",
        "AwsNeuronCustomOp",
        "ResizeNearest",
        "ResizeBilinear",
        "ResizeNearestGrad",
        "AwsNeuronLNCShardingConstraint",
        "AwsNeuronTransferWithStaticRing",
        "AwsNeuronModuleMarkerStart-Forward",
        "AwsNeuronModuleMarkerStart-Backward",
        "AwsNeuronModuleMarkerEnd-Forward",
        "AwsNeuronModuleMarkerEnd-Backward",
        "NeuronBoundaryMarker-Start",
        "NeuronBoundaryMarker-End",
    }
)
# Ops that move data between host and device mid-step: never in an inference step.
HOST_TRANSFER_OPCODES = frozenset({"infeed", "outfeed", "send", "send-done", "recv", "recv-done"})
# A constant larger than this is a weight or a table baked into the module: refused.
MAX_CONSTANT_BYTES = 1024

HLO_ITEMSIZE = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8,
    "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1,
    "f8e5m2": 1, "f8e4m3": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e4m3b11fnuz": 1, "f8e3m4": 1,
}  # fmt: skip


@dataclass(frozen=True)
class HloModule:
    """One lowered function: its StableHLO text, HLO text and serialized HLO module proto."""

    stablehlo: str
    hlo_text: str
    hlo_proto: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.hlo_text.encode()).hexdigest()


def lower(
    fn: Callable[..., Any],
    abstract_args: Sequence[Any],
    donate: Sequence[int] = (),
    platform: str | None = "cpu",
) -> HloModule:
    """Lower `fn` at `abstract_args` (jax.ShapeDtypeStruct) to StableHLO and HLO. Every argument
    stays a parameter (keep_unused) so parameter i of the module is argument i; `donate` marks
    arguments whose buffers the results may reuse (the KV cache): input_output_alias in the HLO.
    `platform` picks JAX's lowering rules: "cpu" (generic) unless the Neuron plugin is the platform
    (None: JAX's default backend), so the module never depends on the GPU a machine happens to have."""
    import jax

    traced = jax.jit(fn, keep_unused=True, donate_argnums=tuple(donate)).trace(*abstract_args)
    lowered = traced.lower(lowering_platforms=(platform,) if platform else None)
    stablehlo = lowered.as_text()
    try:
        computation = lowered.compiler_ir("hlo")
    except (ValueError, NotImplementedError, AttributeError):
        computation = None
    if computation is None or not hasattr(computation, "as_serialized_hlo_module_proto"):
        from jax._src.lib import _jax

        computation = _jax.mlir.mlir_module_to_xla_computation(
            stablehlo, use_tuple_args=False, return_tuple=False
        )
    return HloModule(stablehlo, computation.as_hlo_text(), computation.as_serialized_hlo_module_proto())


# --- the checker -------------------------------------------------------------------------------------

# `  [ROOT ]name = type opcode(operands), attributes`; a type is a tuple `(...)` or one token.
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?(?P<name>[\w.\-]+)\s*=\s*(?P<type>\((?:[^()]|\([^()]*\))*\)|\S+)\s+(?P<opcode>[\w\-]+)\("
)
_ARRAY_TYPE = re.compile(r"(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\]")
_TARGET = re.compile(r'custom_call_target="(?P<target>[^"]*)"')
_PARAMETER = re.compile(r"parameter\((?P<index>\d+)\)")


@dataclass(frozen=True)
class HloParameter:
    index: int
    name: str  # the HLO instruction name
    dtype: str  # HLO element type: bf16, f32, s32 ...
    shape: tuple[int, ...]


@dataclass
class HloCheck:
    """What the checker found in one module, and what it refused (empty `faults`: it passes)."""

    parameters: list[HloParameter] = field(default_factory=list)
    instructions: int = 0
    custom_calls: list[str] = field(default_factory=list)  # targets, allowed ones included
    largest_constant_bytes: int = 0
    constant_bytes: int = 0
    faults: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.faults

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "parameters": len(self.parameters),
            "instructions": self.instructions,
            "custom_calls": sorted(set(self.custom_calls)),
            "allowed_custom_calls": "the targets neuronx-cc recognizes (Neuron docs, NCC_EVRF015)",
            "largest_constant_bytes": self.largest_constant_bytes,
            "constant_limit_bytes": MAX_CONSTANT_BYTES,
            "faults": list(self.faults),
        }


def array_bytes(hlo_type: str) -> int:
    """Bytes of an HLO array type such as `f32[64]{0}` (a tuple type: the sum of its arrays)."""
    total = 0
    for m in _ARRAY_TYPE.finditer(hlo_type):
        dims = [int(d) for d in m.group("dims").split(",") if d.strip()]
        n = 1
        for d in dims:
            n *= d
        total += n * HLO_ITEMSIZE.get(m.group("dtype"), 8)
    return total


def check_hlo(text: str, *, max_constant_bytes: int = MAX_CONSTANT_BYTES) -> HloCheck:
    """Parse HLO text; list the entry computation's parameters; refuse custom calls that neuronx-cc
    does not recognize (host callbacks are custom calls too), host transfers, and constants larger
    than `max_constant_bytes`."""
    check = HloCheck()
    in_entry = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("ENTRY "):
            in_entry = True
            continue
        if stripped == "}":
            in_entry = False
            continue
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        check.instructions += 1
        name, hlo_type, opcode = m.group("name"), m.group("type"), m.group("opcode")
        if opcode == "parameter" and in_entry:
            p = _PARAMETER.search(line, m.end() - len("parameter("))
            t = _ARRAY_TYPE.search(hlo_type)
            if p is not None and t is not None:
                dims = tuple(int(d) for d in t.group("dims").split(",") if d.strip())
                check.parameters.append(HloParameter(int(p.group("index")), name, t.group("dtype"), dims))
        elif opcode == "custom-call":
            target = _TARGET.search(line)
            target_name = target.group("target") if target else "<unnamed>"
            check.custom_calls.append(target_name)
            if target_name not in NEURON_CUSTOM_CALLS:
                check.faults.append(
                    f"`{name}` is a custom call to `{target_name}`, which neuronx-cc cannot compile "
                    "(host callbacks are custom calls); write the kernel in jax.numpy / lax"
                )
        elif opcode in HOST_TRANSFER_OPCODES:
            check.faults.append(f"`{name}` is `{opcode}`: a host transfer inside the step")
        elif opcode == "constant":
            size = array_bytes(hlo_type)
            check.constant_bytes += size
            check.largest_constant_bytes = max(check.largest_constant_bytes, size)
            if size > max_constant_bytes:
                check.faults.append(
                    f"`{name}` is a constant of {size} bytes ({hlo_type}), over the {max_constant_bytes}-byte "
                    "limit: weights and tables must reach the step as arguments (HLO parameters)"
                )
    check.parameters.sort(key=lambda p: p.index)
    return check


def require_ok(check: HloCheck, what: str) -> None:
    if not check.ok:
        more = f" (and {len(check.faults) - 1} more)" if len(check.faults) > 1 else ""
        raise UserError(f"{what}: the HLO module is not fit for neuronx-cc: {check.faults[0]}{more}")
