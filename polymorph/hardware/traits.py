"""A GPU's traits: the limits and programming-model facts that kernel configs and occupancy are chosen
from, read from its profile (hwprofiles/<chip>.toml), never from a family test in a kernel file.

`traits_of(profile)` gives one frozen `Traits` per chip. Figures come from the profile's `[figures]`
(each with its source); the compiler-facing facts (what Triton calls the backend, which launch options
it takes, the matrix instruction the arch has, the software-pipelining depth that suits it) come from
the profile's `[compiler]` table. A chip whose profile lacks a trait a caller needs is an error that
names the profile file and the missing key, not a silent default.

Kernel files get their target's traits (`traits_for(target)`, through kernel_files.py) and choose
their configs from them, never from the target's family: a new chip is one profile file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from polymorph.errors import UserError
from polymorph.hardware import catalog
from polymorph.hardware.profile import Profile, load_profile
from polymorph.hardware.target import Target


@dataclass(frozen=True)
class Traits:
    """What a GPU offers one kernel. Sizes in bytes, counts per SM (cuda) or CU (rocm): a `unit`."""

    target: Target
    profile: str  # the profile id the traits were read from
    triton_backend: str  # GPUTarget's backend name: "cuda" or "hip"
    triton_arch: int | str  # GPUTarget's arch: 90, 100, "gfx942"
    warp_size: int  # threads per warp / wavefront
    units: int  # SMs or CUs
    shared_per_unit: int  # shared memory / LDS per unit
    shared_per_block: int  # the most one block / workgroup may allocate
    max_warps_per_unit: int  # resident warps / waves per unit
    registers_per_unit: int  # 32-bit registers per unit (all SIMDs of a CU together)
    # Registers are allocated in multiples of this: per lane on AMD, per warp on NVIDIA.
    register_granule: int
    max_blocks_per_unit: int  # resident blocks / workgroups per unit
    simds_per_unit: int  # 4 on CDNA; 4 SM sub-partitions on NVIDIA (one warp scheduler each)
    matrix_instruction: str  # the arch's matrix-multiply instruction family: wgmma, tcgen05, mfma, mma
    pipeline_stages: int  # software-pipelining depth that suits the arch's async copies
    # Triton launch options the arch takes beyond num_warps and num_stages (waves_per_eu on AMD).
    launch_options: frozenset[str] = field(default_factory=frozenset)
    # The arch takes programmatic dependent launch: a kernel may start while the one before it in the
    # stream finishes, and waits for it where it calls griddepcontrol.wait (kernels/triton/_pdl.py).
    programmatic_dependent_launch: bool = False

    @property
    def waves_per_simd(self) -> int:
        """Resident warps (waves) one SIMD / sub-partition holds at most."""
        return self.max_warps_per_unit // self.simds_per_unit

    @property
    def registers_per_lane(self) -> int:
        """Registers one lane of one SIMD holds (512 VGPRs on CDNA3/4; 65536 / 128 = 512 on Hopper)."""
        return self.registers_per_unit // (self.simds_per_unit * self.warp_size)


_REQUIRED = (
    "compute_units",
    "shared_memory_per_unit",
    "shared_memory_per_block",
    "register_file_per_unit",
    "register_allocation_unit",
    "warp_size",
    "max_warps_per_unit",
    "max_blocks_per_unit",
    "simds_per_unit",
)


def traits_of(profile: Profile) -> Traits:
    """The traits of a GPU profile. Raises UserError naming the file and the first missing key."""
    if not profile.target.is_gpu:
        raise UserError(f"{profile.path}: {profile.target} is not a GPU; it has no kernel traits")
    figures = {}
    for key in _REQUIRED:
        fig = profile.figure(key, calibrated=False)
        if fig is None:
            raise UserError(
                f"{profile.path}: `figures.{key}` is missing; a GPU profile needs it for its traits"
            )
        figures[key] = fig.si
    compiler = profile.compiler
    for key in ("triton_backend", "matrix_instruction", "pipeline_stages"):
        if key not in compiler:
            raise UserError(
                f"{profile.path}: `compiler.{key}` is missing; a GPU profile needs it for its traits"
            )
    return Traits(
        target=profile.target,
        profile=profile.id,
        triton_backend=str(compiler["triton_backend"]),
        triton_arch=profile.target.triton_arch,
        warp_size=int(figures["warp_size"]),
        units=int(figures["compute_units"]),
        shared_per_unit=int(figures["shared_memory_per_unit"]),
        shared_per_block=int(figures["shared_memory_per_block"]),
        max_warps_per_unit=int(figures["max_warps_per_unit"]),
        registers_per_unit=int(figures["register_file_per_unit"]) // 4,
        register_granule=int(figures["register_allocation_unit"]),
        max_blocks_per_unit=int(figures["max_blocks_per_unit"]),
        simds_per_unit=int(figures["simds_per_unit"]),
        matrix_instruction=str(compiler["matrix_instruction"]),
        pipeline_stages=int(compiler["pipeline_stages"]),
        launch_options=frozenset(compiler.get("launch_options", ())),
        programmatic_dependent_launch=bool(compiler.get("programmatic_dependent_launch", False)),
    )


# What a profile says about one chip rather than its arch: kernels never choose configs from these, so
# profiles of one arch (h100 and h200 are both sm_90) may differ in them.
_CHIP_FIELDS = ("profile", "units")


def traits_for(target: Target) -> Traits:
    """The traits of a GPU target, from the profiles that name it: the first by id, with `units` the
    smallest chip's (so a plan is the same wherever it is made). Every profile of the target must agree
    on every other trait, or it is a UserError naming the two profiles and the trait. For kernel files,
    which are given a target, not a chip."""
    if not target.is_gpu:
        raise UserError(f"{target} is not a GPU; it has no kernel traits")
    ids = sorted(pid for pid, text in catalog.profile_targets().items() if text == str(target))
    if not ids:
        raise UserError(f"no profile names {target}; a GPU target's traits come from its profile")
    found = [_traits_of_id(pid) for pid in ids]
    first = found[0]
    for other in found[1:]:
        for f in dataclasses.fields(Traits):
            if f.name not in _CHIP_FIELDS and getattr(other, f.name) != getattr(first, f.name):
                raise UserError(
                    f"profiles `{first.profile}` and `{other.profile}` both name {target} but disagree on "
                    f"`{f.name}` ({getattr(first, f.name)} against {getattr(other, f.name)}); an arch's "
                    f"kernel traits must be one, so fix one of the files"
                )
    return dataclasses.replace(first, units=min(t.units for t in found))


def kernel_traits(target: Target | Traits) -> Traits | None:
    """What a kernel file's `configs`, `build`, `compile_units` and `launches` are given: the traits
    as they are, a GPU target's traits (traits_for), or None for cpu and neuron, whose kernels take
    nothing from the chip."""
    if isinstance(target, Traits):
        return target
    return traits_for(target) if target.is_gpu else None


_CACHE: dict[str, tuple[object, Traits]] = {}  # profile id -> (its file's stamp, traits)


def _traits_of_id(pid: str) -> Traits:
    """traits_of(the profile `pid`), read again only when its file changed (kernel files ask often)."""
    entry = catalog.profile_files()[pid]
    try:
        stat = entry.stat()  # type: ignore[attr-defined]
        stamp: object = (str(entry), stat.st_size, stat.st_mtime_ns)
    except AttributeError:  # a zipped wheel's resource: it cannot change
        stamp = str(entry)
    cached = _CACHE.get(pid)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    traits = traits_of(load_profile(pid))
    _CACHE[pid] = (stamp, traits)
    return traits
