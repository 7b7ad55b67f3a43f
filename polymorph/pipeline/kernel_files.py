"""Kernel files: the unit a backend's plan names, an agent proposes, and the engine hot-reloads.

A kernel is a Python file under `kernels/<language>/` exposing:
  IMPLEMENTS  the op name (from the op table) or fused-pattern name it implements, or a tuple of them;
              a kind of general group (`elementwise`, `reduction`: polymorph/passes/fuse_general.py)
              takes every pattern `kind:...` of that kind
  CONFIGS     the tunable space: a list of dicts (the first is the default)
  supports(spec: KernelSpec) -> bool         shapes, dtypes and target it handles
  build(spec: KernelSpec, config: dict, traits: Traits | None) -> launch
              where launch(inputs, outputs, scratch) runs it: inputs are the group's external inputs
              in `spec.inputs` order, outputs the preallocated tensors of `spec.outputs` it must write.
Optional:
  configs(traits: Traits | None) -> list[dict]    the space for one chip, instead of CONFIGS
  compile_units(spec, config, traits) -> list[CompileUnit]
              the Triton kernels `build` would launch for this (concrete-shaped) spec, for
              ahead-of-time compilation to device code without the device (PTX/cubin, AMDGCN/HSACO)
  launches(spec, config, traits) -> int
              the kernels one call launches, where that is not one per compile unit (a unit launched
              once per projection; torch ops around the Triton kernels): the cost model's count
`traits` is what the target offers a kernel (polymorph/hardware/traits.py: warp width, shared memory /
LDS per block, pipelining depth, launch options, matrix instruction), read from the profiles that name
the target; `traits.target` is the Target. It is None on cpu and neuron, which are not GPUs: their
kernels take nothing from the chip. `spec.traits` carries the same for `supports`. A kernel file
chooses its configs from these traits and never tests the target's family or names an arch or a
vendor, so a new chip is one profile file (the Triton files map one generic space onto a chip in
kernels/triton/_targets.py). Callers hand `KernelFile`'s methods a Target or its Traits.
A file is loaded by path as a fresh module every time (the hot-reload primitive) and is named by the
sha256 of its source, so a plan names exactly the code it was built with.

Code several kernel files share lives in a module whose name starts with `_` (never a kernel itself),
which a kernel file takes with `depend("triton/_projection.py", "<sha256>")`: the pinned hash is part
of the kernel file's own text, so the kernel's name still covers every line it runs. After editing a
shared module, `python -m polymorph.pipeline.kernel_files --repin` rewrites the pins in the library.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

from polymorph.errors import UserError
from polymorph.hardware.target import Target
from polymorph.hardware.traits import Traits, kernel_traits
from polymorph.ir.graph import Node, TensorType

Launch = Callable[[list[Any], list[Any], Any], None]


@dataclass(frozen=True)
class KernelSpec:
    """What a kernel is asked to implement: one node group with its types, for one target. `traits`
    is what the target offers a kernel (None on cpu and neuron, or where the caller gave none)."""

    pattern: str
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    types: Mapping[str, TensorType] = field(repr=False)
    target: Target
    roles: tuple[tuple[str, tuple[str, ...]], ...] = ()
    traits: Traits | None = field(default=None, repr=False)

    def role(self, step: str) -> Node:
        """The node that matched `step` of the group's fusion pattern (the first, for a many=True step)."""
        for name, nodes in self.roles:
            if name == step:
                return next(n for n in self.nodes if n.name == nodes[0])
        raise KeyError(f"{self.pattern} has no step `{step}`")

    def node(self, op: str) -> Node:
        """The (first) node of the group with op `op`."""
        for n in self.nodes:
            if n.op == op:
                return n
        raise KeyError(op)

    def args(self, node: Node) -> list[int]:
        """Where each input of `node` sits in the launch's `inputs` list (group inputs are deduplicated)."""
        return [self.inputs.index(v) for v in node.inputs]

    @property
    def single(self) -> Node:
        """The node of a single-op group."""
        assert len(self.nodes) == 1, f"{self.pattern} groups {len(self.nodes)} nodes"
        return self.nodes[0]

    def attrs(self, node: Node | None = None) -> dict[str, Any]:
        """The node's attributes with the op table's defaults filled in."""
        from polymorph.ir.ops import normalize_attrs, op_def

        node = node or self.single
        return normalize_attrs(op_def(node.op), node.attrs)

    def input_types(self) -> list[TensorType]:
        return [self.types[v] for v in self.inputs]

    def output_types(self) -> list[TensorType]:
        return [self.types[v] for v in self.outputs]


@dataclass(frozen=True)
class CompileUnit:
    """One specialization of one Triton kernel, as `triton.compile(ASTSource(...))` takes it.

    `signature` maps every argument of `fn` to a Triton type (`*bf16`, `*fp32`, `*i32`, `i32`, `fp32`)
    or "constexpr"; `constexprs` gives the constexpr values; `options` are compile options
    (num_warps, num_stages, and those of `traits.launch_options` the arch takes, e.g. waves_per_eu)."""

    name: str
    fn: Any
    signature: Mapping[str, str]
    constexprs: Mapping[str, Any]
    options: Mapping[str, Any]


@dataclass(frozen=True)
class KernelFile:
    path: Path
    sha256: str
    implements: tuple[str, ...]
    configs: tuple[dict[str, Any], ...]
    module: ModuleType = field(repr=False, compare=False)
    depends: tuple[tuple[str, str], ...] = ()  # (library path, sha256) of each shared module it took

    @property
    def name(self) -> str:
        return self.path.stem

    def supports(self, spec: KernelSpec) -> bool:
        # A general group's pattern (`elementwise:mul+add`) is taken by a file naming its kind.
        kind = spec.pattern.partition(":")[0]
        return (spec.pattern in self.implements or kind in self.implements) and bool(
            self.module.supports(spec)
        )

    def build(self, spec: KernelSpec, config: Mapping[str, Any], target: Target | Traits) -> Launch:
        return self.module.build(spec, dict(config), kernel_traits(target))

    def configs_for(self, target: Target | Traits) -> tuple[dict[str, Any], ...]:
        """The config space for `target` (the file's `configs(traits)`, else CONFIGS)."""
        if hasattr(self.module, "configs"):
            return tuple(dict(c) for c in self.module.configs(kernel_traits(target)))
        return self.configs

    def launches(self, spec: KernelSpec, config: Mapping[str, Any], target: Target | Traits) -> int:
        """Kernels one call launches (the file's `launches`, else one per compile unit, at least one)."""
        if hasattr(self.module, "launches"):
            return int(self.module.launches(spec, dict(config), kernel_traits(target)))
        return max(len(self.compile_units(spec, config, target)), 1)

    def compile_units(
        self, spec: KernelSpec, config: Mapping[str, Any], target: Target | Traits
    ) -> list[CompileUnit]:
        """The Triton kernels to compile ahead of time; [] for a file with no device code of its own."""
        if not hasattr(self.module, "compile_units"):
            return []
        return list(self.module.compile_units(spec, dict(config), kernel_traits(target)))


def kernels_root() -> Path:
    return Path(str(resources.files("polymorph.kernels")))


def source_hash(source: bytes) -> str:
    return hashlib.sha256(source).hexdigest()


def store_source(folder: Path, source: str) -> Path:
    """`source` as `folder/<sha256>.py` (content-addressed, so the same text is one file), written whole
    and then renamed: another process may load the same file at the same time."""
    import os

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{source_hash(source.encode())}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source, encoding="utf-8")  # the bytes the name hashes
        os.replace(tmp, path)
    return path


@dataclass
class _Loading:
    module: str  # the name of the module being imported
    folder: Path  # where its file lies (a compile output or a candidate store keeps copies there)
    depends: list[tuple[str, str]] = field(default_factory=list)


_LOADING: list[_Loading] = []  # the files being imported, innermost last (under _LOCK)
_LOCK = threading.RLock()  # one import at a time: _LOADING and sys.modules entries are shared


def depend(name: str, sha256: str) -> ModuleType:
    """The shared module `name` (a path under kernels/, e.g. "triton/_projection.py") at exactly
    `sha256`, for a kernel file to call at import. A copy `<sha256>.py` beside any file being imported
    (innermost first: a compile output or a candidate store keeps them there) is taken first, else the
    library's; any other content is an ImportError, never a silent substitution.

    Each importing file gets a fresh module of its own, as a kernel file itself is fresh on every load:
    a candidate that rebinds something in a shared module changes nothing for the stock kernels beside
    it, and the module reads TRITON_INTERPRET as its importer does."""
    with _LOCK:  # re-entrant: a kernel's import holds it already; any other caller waits its turn
        return _depend(name, sha256)


def _depend(name: str, sha256: str) -> ModuleType:
    beside = [loading.folder / f"{sha256}.py" for loading in reversed(_LOADING)]
    for path in (*beside, kernels_root() / name):
        if not path.is_file():
            continue
        source = path.read_bytes()
        if source_hash(source) != sha256:
            if path.name == f"{sha256}.py":
                continue  # a damaged copy: the library may still hold the right text
            raise ImportError(
                f"the kernel needs {name} at sha256 {sha256[:12]} but {path} is {source_hash(source)[:12]}: "
                "after editing a shared module, run `python -m polymorph.pipeline.kernel_files --repin`"
            )
        importer = _LOADING[-1].module if _LOADING else "polymorph_kernel"
        module = _import(path, f"{importer}__{Path(name).stem.lstrip('_')}_{sha256[:16]}")
        for loading in _LOADING:  # every file being imported needs it and what it depends on
            loading.depends.extend(d for d in ((name, sha256), *module.__polymorph_depends__)
                                   if d not in loading.depends)  # fmt: skip
        return module
    raise ImportError(f"the kernel needs {name} (sha256 {sha256[:12]}), which is in no searched folder")


def _import(path: Path, mod_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with _LOCK:
        sys.modules[mod_name] = module  # dataclasses and triton.jit look the module up by name
        loading = _Loading(mod_name, path.parent)
        try:
            _LOADING.append(loading)
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(mod_name, None)
            raise
        finally:
            if _LOADING and _LOADING[-1] is loading:
                _LOADING.pop()
    module.__dict__.setdefault("__polymorph_depends__", tuple(loading.depends))
    return module


def load_kernel(path: str | Path) -> KernelFile:
    """Load a kernel file as a fresh module; UserError naming the file if it breaks the contract."""
    path = Path(path)
    try:
        source = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read the kernel file ({e.strerror})") from None
    digest = source_hash(source)
    try:
        module = _import(path, f"polymorph_kernel_{path.stem}_{digest[:16]}")
    except Exception as e:  # a candidate's own code: report it, never crash the caller
        raise UserError(f"{path}: the kernel file fails to import: {type(e).__name__}: {e}") from None
    for attr in ("IMPLEMENTS", "CONFIGS", "supports", "build"):
        if not hasattr(module, attr):
            raise UserError(
                f"{path}: a kernel file must define `{attr}` (see polymorph/pipeline/kernel_files.py)"
            )
    implements = module.IMPLEMENTS
    implements = (implements,) if isinstance(implements, str) else tuple(implements)
    configs = tuple(dict(c) for c in module.CONFIGS)
    if not configs:
        raise UserError(f"{path}: CONFIGS is empty; give at least the default config")
    return KernelFile(path, digest, implements, configs, module, tuple(sorted(module.__polymorph_depends__)))


def kernel_library(language: str) -> list[KernelFile]:
    """Every kernel file shipped in a kernel language (`kernels/<language>/*.py`), freshly loaded."""
    folder = kernels_root() / language
    if not folder.is_dir():
        return []
    return [load_kernel(p) for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")]


def load_choice(file: str, sha256: str, artifact_dir: Path | None = None) -> KernelFile:
    """The kernel a plan names: the copy in a compile output when there is one, else the library file.
    The content hash must match; a changed file is an error, never a silent substitution."""
    candidates = []
    if artifact_dir is not None:
        candidates.append(artifact_dir / "kernels" / f"{sha256}.py")
    path = Path(file)
    candidates.append(path if path.is_absolute() else kernels_root() / path)
    for candidate in candidates:
        if candidate.is_file():
            kernel = load_kernel(candidate)
            if kernel.sha256 != sha256:
                raise UserError(
                    f"{candidate}: kernel source changed since the plan was made "
                    f"(sha256 {kernel.sha256[:12]} != {sha256[:12]}); recompile the plan"
                )
            return kernel
    raise UserError(f"kernel `{file}` ({sha256[:12]}) not found in {', '.join(map(str, candidates))}")


def copy_kernel_sources(plan: Any, out_dir: Path) -> list[str]:
    """Copy the source of every kernel a plan names to `out_dir/kernels/<sha256>.py`, so a compile
    output runs the code it was compiled from; return the written paths relative to `out_dir`."""
    import shutil

    kernel_dir = out_dir / "kernels"
    kernel_dir.mkdir(parents=True, exist_ok=True)
    written = []
    done: set[str] = set()
    for group in plan.groups:
        if group.kernel.sha256 in done:  # the layers' groups share their kernel files
            continue
        done.add(group.kernel.sha256)
        src = Path(group.kernel.file)
        origin = src if src.is_absolute() else kernels_root() / src
        dest = kernel_dir / f"{group.kernel.sha256}.py"
        if not dest.exists():
            shutil.copyfile(origin, dest)
            written.append(str(dest.relative_to(out_dir)))
        text = dest.read_bytes().decode("utf-8")
        found = pinned_sources(text, beside=origin.parent)  # as `depend` finds them for `origin`
        have = {sha for _, sha, _ in found}
        missing = sorted(
            {name for t in (text, *(f[2] for f in found)) for name, sha in pins(t) if sha not in have}
        )
        if missing:
            raise UserError(f"{origin}: the shared modules it pins are not found: {', '.join(missing)}")
        for _, sha, shared in found:  # beside the kernel, where `depend` looks first
            dep = kernel_dir / f"{sha}.py"
            if not dep.exists():
                dep.write_bytes(shared.encode("utf-8"))
                written.append(str(dep.relative_to(out_dir)))
    return written


_PIN = re.compile(r"""depend\(\s*["']([^"']+)["'],\s*["']([0-9a-f]{64})["']\s*\)""")


def pins(source: str) -> list[tuple[str, str]]:
    """(name, sha256) of each `depend` pin in a kernel's source."""
    return _PIN.findall(source)


def pinned_closure(source: str, text_of: Callable[[str, str], str | None]) -> list[tuple[str, str, str]]:
    """(name, sha256, text) of each shared module `source` pins, and of each those pin in turn, once
    each; `text_of(name, sha256)` finds a module's text (None: not found, left out)."""
    out: list[tuple[str, str, str]] = []
    todo = pins(source)
    while todo:
        name, sha = todo.pop(0)
        if any(sha == seen for _, seen, _ in out):
            continue
        text = text_of(name, sha)
        if text is not None:
            out.append((name, sha, text))
            todo += pins(text)
    return out


def pinned_sources(source: str, beside: Path | None = None) -> list[tuple[str, str, str]]:
    """(name, sha256, text) of every shared module a kernel's source runs (pinned_closure), found as
    `depend` finds it: `beside/<sha256>.py`, then the library. The code a kernel runs is its own text
    and these: prompts show them, champions and compile outputs carry them."""

    def text_of(name: str, sha: str) -> str | None:
        for path in ([beside / f"{sha}.py"] if beside is not None else []) + [kernels_root() / name]:
            raw = (
                path.read_bytes() if path.is_file() else b""
            )  # bytes: the hash is of the bytes, CRLF and all
            if source_hash(raw) == sha:
                return raw.decode("utf-8")
        return None

    return pinned_closure(source, text_of)


def repin(root: Path | None = None) -> list[Path]:
    """Rewrite every library kernel's `depend(name, sha)` pin to the shared module's current hash;
    the files changed. For maintainers after editing a shared module (`--repin`)."""
    root = root or kernels_root()
    changed: list[Path] = []
    for _ in range(16):  # a shared module may pin another: repeat until every pin holds
        done = _repin_pass(root)
        changed += [p for p in done if p not in changed]
        if not done:
            return changed
    raise UserError(
        f"the pins never settle: shared modules pin each other in a cycle ({', '.join(p.name for p in done)})"
    )


def _repin_pass(root: Path) -> list[Path]:
    changed = []
    for path in sorted(root.glob("*/*.py")):
        text = path.read_text(encoding="utf-8")

        def current(m: re.Match[str]) -> str:
            return f'depend("{m[1]}", "{source_hash((root / m[1]).read_bytes())}")'

        new = _PIN.sub(current, text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["--repin"]:
        print("usage: python -m polymorph.pipeline.kernel_files --repin", file=sys.stderr)
        sys.exit(2)
    for changed_path in repin():
        print(f"repinned {changed_path}")
