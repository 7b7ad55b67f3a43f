"""A GPU's traits: the limits and programming-model facts that kernel configs and occupancy are chosen
from, read from its profile (hwprofiles/<chip>.toml), never from a family test in a kernel file.

`traits_of(profile)` gives one frozen `Traits` per chip. Figures come from the profile's `[figures]`
(each with its source); the compiler-facing facts (what Triton calls the backend, which launch options
it takes, the matrix instruction the arch has, the software-pipelining depth that suits it) come from
the profile's `[compiler]` table. A chip whose profile lacks a trait a caller needs is an error that
names the profile file and the missing key, not a silent default.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polymorph.errors import UserError
from polymorph.hardware.profile import Profile
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
    )
