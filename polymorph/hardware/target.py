"""Targets: the only way polymorph code names hardware.

A `Target` is a chip family plus an architecture, written `family:arch` (`cuda:sm_90`, `rocm:gfx950`,
`neuron:trn2`) or just `cpu`. Strings are parsed into their parts and checked against a closed table;
code then asks the parsed fields (`compute_capability`, `gfx_arch`, `warp_size`), never
`"gfx9" in arch`. An arch outside the table is an error, not a guess: tinygrad silently treats any
unknown AMD arch as RDNA3, and PyTorch's ROCm build answers to "cuda".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from polymorph.errors import UserError

FAMILIES: tuple[str, ...] = ("cpu", "cuda", "rocm", "neuron")

# The archs each family's backend supports. Adding one is a deliberate act: the hwprofile, the
# backend's lowering and the compile-only tests must follow.
ARCHS: dict[str, tuple[str, ...]] = {
    "cpu": (),
    "cuda": ("sm_90", "sm_100", "sm_103"),
    "rocm": ("gfx942", "gfx950"),
    "neuron": ("trn2",),
}

# The shape an arch must have before it is looked up, so that a malformed one (`cuda:90`) gets a
# message about its form and a well-formed unknown one (`cuda:sm_80`) a message about support.
_ARCH_FORM: dict[str, tuple[re.Pattern[str], str]] = {
    "cuda": (re.compile(r"sm_([1-9][0-9]*)([0-9])"), "sm_<major><minor>, e.g. sm_90"),
    # LLVM AMDGPU names: gfx<major><minor><stepping>, the stepping a hex digit (gfx90a, gfx1100).
    "rocm": (re.compile(r"gfx[0-9]{1,2}[0-9][0-9a-f]"), "gfx<major><minor><stepping>, e.g. gfx942"),
    "neuron": (re.compile(r"trn[0-9]+"), "trn<generation>, e.g. trn2"),
}

_WARP_SIZE: dict[str, int] = {"cuda": 32, "rocm": 64}
_COMPUTE_UNIT: dict[str, str] = {"cpu": "core", "cuda": "SM", "rocm": "CU", "neuron": "NeuronCore"}


def known_targets() -> tuple[str, ...]:
    """Every target string `Target.parse` accepts, in canonical form."""
    out: list[str] = []
    for family in FAMILIES:
        archs = ARCHS[family]
        out.extend([family] if not archs else [f"{family}:{arch}" for arch in archs])
    return tuple(out)


@dataclass(frozen=True)
class Target:
    """A chip family and architecture. Construction validates, so every `Target` that exists is one
    polymorph supports; `str(target)` is the canonical string and `Target.parse(str(t)) == t`."""

    family: str
    arch: str | None = None

    def __post_init__(self) -> None:
        if self.family not in ARCHS:
            raise UserError(
                f"unknown target family `{self.family}`; accepted targets: {', '.join(known_targets())}"
            )
        archs = ARCHS[self.family]
        if not archs:
            if self.arch is not None:
                raise UserError(f"target `{self.family}` takes no arch; write it as `{self.family}`")
            return
        if self.arch is None:
            raise UserError(
                f"target `{self.family}` needs an arch; accepted: "
                + ", ".join(f"{self.family}:{a}" for a in archs)
            )
        pattern, form = _ARCH_FORM[self.family]
        if not pattern.fullmatch(self.arch):
            raise UserError(
                f"`{self.arch}` is not a {self.family} arch; write it as {form} "
                f"(accepted: {', '.join(f'{self.family}:{a}' for a in archs)})"
            )
        if self.arch not in archs:
            raise UserError(
                f"{self.family} arch `{self.arch}` is not supported; accepted: "
                + ", ".join(f"{self.family}:{a}" for a in archs)
            )

    @classmethod
    def parse(cls, text: str) -> Target:
        """Parse `family:arch` or a bare family with no archs (`cpu`). Raises `UserError` listing the
        accepted targets for an unknown family, a malformed arch or an unsupported one."""
        family, sep, arch = text.partition(":")
        if family not in ARCHS:
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
    def warp_size(self) -> int | None:
        """Threads per warp (cuda, 32) or wavefront (rocm, 64; CDNA runs wave64); None where the
        programming model has no such unit (cpu, and neuron's 128-partition tiles)."""
        return _WARP_SIZE.get(self.family)

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
