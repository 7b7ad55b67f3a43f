"""Targets: the only way polymorph code names hardware.

A `Target` is a chip family plus an architecture, written `family:arch` (`cuda:sm_90`, `rocm:gfx950`,
`neuron:trn2`) or just `cpu`. Strings are parsed into their parts and checked; code then asks the
parsed fields (`compute_capability`, `gfx_arch`), never `"gfx9" in arch`. An arch is accepted when a
hardware profile names it (each `hwprofiles/<id>.toml`, and each file in a POLYMORPH_PROFILES
directory, has a `target` line; catalog.py finds them), so a new chip is one profile file. An arch no
profile names is an error that lists the accepted ones, not a guess: tinygrad silently treats any
unknown AMD arch as RDNA3, and PyTorch's ROCm build answers to "cuda". What a chip offers a kernel
(warp width, LDS, pipelining depth) is its profile's data (traits.py), not a property of the family.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from polymorph.errors import UserError

FAMILIES: tuple[str, ...] = ("cpu", "cuda", "rocm", "neuron")  # closed: a family needs a backend
_ARCHLESS = frozenset({"cpu"})  # families whose target takes no arch

# The shape an arch must have before it is looked up, so that a malformed one (`cuda:90`) gets a
# message about its form and a well-formed unknown one (`cuda:sm_80`) a message about support.
_ARCH_FORM: dict[str, tuple[re.Pattern[str], str]] = {
    "cuda": (re.compile(r"sm_([1-9][0-9]*)([0-9])"), "sm_<major><minor>, e.g. sm_90"),
    # LLVM AMDGPU names: gfx<major><minor><stepping>, the stepping a hex digit (gfx90a, gfx1100).
    "rocm": (re.compile(r"gfx[0-9]{1,2}[0-9][0-9a-f]"), "gfx<major><minor><stepping>, e.g. gfx942"),
    "neuron": (re.compile(r"trn[0-9]+"), "trn<generation>, e.g. trn2"),
}

# The warp / wavefront widths a family's programming model has; a profile's `figures.warp_size` is
# checked against them (CDNA runs wave64; RDNA runs wave32; NVIDIA warps are 32 wide).
_WARP_SIZES: dict[str, tuple[int, ...]] = {"cuda": (32,), "rocm": (32, 64)}
_COMPUTE_UNIT: dict[str, str] = {"cpu": "core", "cuda": "SM", "rocm": "CU", "neuron": "NeuronCore"}


def archs(family: str) -> tuple[str, ...]:
    """The archs of `family` that some profile names, well-formed ones only, in numeric order (a
    profile naming a malformed arch fails when it is loaded, with the form it should have)."""
    if family not in _ARCH_FORM:
        return ()
    from polymorph.hardware.catalog import profile_targets  # lazily: catalog reads the knobs

    pattern = _ARCH_FORM[family][0]
    found = set()
    for text in profile_targets().values():
        fam, sep, arch = text.partition(":")
        if fam == family and sep and pattern.fullmatch(arch):
            found.add(arch)
    return tuple(sorted(found, key=lambda a: (len(a), a)))


def _unreadable_note() -> str:
    """'; ...' naming the profile files that could not be read, or '' when every file was read."""
    from polymorph.hardware.catalog import unreadable_profiles

    bad = unreadable_profiles()
    if not bad:
        return ""
    return "; profile files left out, fix them if one was meant to name it: " + "; ".join(
        f"{path} ({why})" for path, why in bad.items()
    )


def known_targets() -> tuple[str, ...]:
    """Every target string `Target.parse` accepts now, in canonical form."""
    out: list[str] = []
    for family in FAMILIES:
        out.extend([family] if family in _ARCHLESS else [f"{family}:{arch}" for arch in archs(family)])
    return tuple(out)


@dataclass(frozen=True)
class Target:
    """A chip family and architecture. Construction validates, so every `Target` that exists is one
    polymorph supports; `str(target)` is the canonical string and `Target.parse(str(t)) == t`."""

    family: str
    arch: str | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise UserError(
                f"unknown target family `{self.family}`; accepted targets: {', '.join(known_targets())}"
            )
        if self.family in _ARCHLESS:
            if self.arch is not None:
                raise UserError(f"target `{self.family}` takes no arch; write it as `{self.family}`")
            return
        pattern, form = _ARCH_FORM[self.family]
        known = archs(self.family)
        accepted = ", ".join(f"{self.family}:{a}" for a in known) or "none (no profile names one)"
        if self.arch is None:
            raise UserError(f"target `{self.family}` needs an arch; accepted: {accepted}")
        if not pattern.fullmatch(self.arch):
            raise UserError(
                f"`{self.arch}` is not a {self.family} arch; write it as {form} (accepted: {accepted})"
            )
        if self.arch not in known:
            raise UserError(
                f"{self.family} arch `{self.arch}` is not supported; accepted: {accepted}. A new chip is "
                f"one profile file naming it (hwprofiles/, or a directory in POLYMORPH_PROFILES)"
                + _unreadable_note()
            )

    @classmethod
    def parse(cls, text: str) -> Target:
        """Parse `family:arch` or a bare family with no archs (`cpu`). Raises `UserError` listing the
        accepted targets for an unknown family, a malformed arch or an unsupported one."""
        family, sep, arch = text.partition(":")
        if family not in FAMILIES:
            raise UserError(f"unknown target `{text}`; accepted targets: {', '.join(known_targets())}")
        if sep and not arch:
            raise UserError(f"target `{text}` has an empty arch; accepted: {', '.join(known_targets())}")
        return cls(family, arch if sep else None)

    def __str__(self) -> str:
        return self.family if self.arch is None else f"{self.family}:{self.arch}"

    @property
    def is_gpu(self) -> bool:
        return self.family in ("cuda", "rocm")

    @property
    def warp_sizes(self) -> tuple[int, ...]:
        """The warp / wavefront widths the family's programming model has (cuda 32; rocm 64 on CDNA, 32
        on RDNA); () where it has no such unit (cpu, and neuron's 128-partition tiles). A chip's own
        width is its profile's `figures.warp_size` (traits.py)."""
        return _WARP_SIZES.get(self.family, ())

    @property
    def compute_unit(self) -> str:
        """What the family calls its replicated compute block: SM, CU, NeuronCore, core."""
        return _COMPUTE_UNIT[self.family]

    @property
    def compute_capability(self) -> tuple[int, int]:
        """(major, minor) of a cuda target: sm_90 -> (9, 0), sm_103 -> (10, 3)."""
        if self.family != "cuda" or self.arch is None:
            raise ValueError(f"compute_capability is a cuda property; target is {self}")
        match = _ARCH_FORM["cuda"][0].fullmatch(self.arch)
        assert match is not None  # __post_init__ checked the form
        return int(match.group(1)), int(match.group(2))

    @property
    def gfx_arch(self) -> str:
        """The LLVM AMDGPU processor name of a rocm target (gfx942, gfx950)."""
        if self.family != "rocm" or self.arch is None:
            raise ValueError(f"gfx_arch is a rocm property; target is {self}")
        return self.arch

    @property
    def triton_arch(self) -> int | str:
        """The `arch` field of Triton's `GPUTarget`: an int for cuda (90, 100, 103), the gfx name for
        rocm."""
        if self.family == "cuda":
            major, minor = self.compute_capability
            return major * 10 + minor
        if self.family == "rocm":
            return self.gfx_arch
        raise ValueError(f"triton_arch is a GPU property; target is {self}")
