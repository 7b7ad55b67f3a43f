"""Test-suite settings: hypothesis profiles and lazy skips for device-marked tests.

HYPOTHESIS_PROFILE picks the profile: `dev` (default) or `ci` (what `nox -s tests` sets).

A test marked `cuda`, `rocm` or `neuron` is skipped, with the reason, unless that device is here.
Nothing is probed at import: a device is looked for once, and only when a test with its marker has
been collected.

No test writes into the real home: XDG_DATA_HOME (where the board and the registry live by default)
points at a fresh temporary folder for the whole session, and POLYMORPH_BOARD / POLYMORPH_REGISTRY
are unset, in this process and in every process a test starts.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# `python -m pytest` (what nox and CI run) puts the working directory first on sys.path. At the
# checkout's root that is where `kernels/` lies (installed as polymorph.kernels), and a folder of that
# name shadows the `kernels` distribution transformers >= 5.25 imports: every transformers oracle test
# then fails on `from kernels import ...`. polymorph itself is imported from its installation, so the
# root leaves the path (spawned children get the parent's path).
_ROOT = os.path.realpath(Path(__file__).resolve().parent.parent)
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _ROOT]
if getattr(sys.modules.get("kernels"), "__file__", None) and os.path.realpath(
    sys.modules["kernels"].__file__
).startswith(_ROOT + os.sep):
    del sys.modules["kernels"]

try:
    from hypothesis import settings
except ImportError:  # the hypothesis tests then fail on their own import; the rest still run
    settings = None

if settings is not None:
    settings.register_profile("ci", max_examples=50, deadline=None, derandomize=False, print_blob=True)
    settings.register_profile("dev", max_examples=20, deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@functools.cache
def _torch_gpu_absent(want_hip: bool) -> str | None:
    """Why torch sees no GPU of the wanted kind here, or None when it does."""
    vendor = "an AMD GPU under ROCm" if want_hip else "an NVIDIA GPU"
    try:
        import torch
    except ImportError as exc:
        return f"needs {vendor}: torch is not importable ({exc})"
    build = "ROCm" if torch.version.hip else "CUDA" if torch.version.cuda else "CPU-only"
    if build != ("ROCm" if want_hip else "CUDA"):
        return f"needs {vendor}: torch {torch.__version__} is a {build} build"
    # ROCm builds of torch answer through torch.cuda too; the build check above tells them apart.
    if not torch.cuda.is_available():
        return (
            f"needs {vendor}: torch {torch.__version__} sees no device (torch.cuda.is_available() is False)"
        )
    return None


@functools.cache
def _neuron_absent() -> str | None:
    if Path("/dev/neuron0").exists():
        return None
    return "needs an AWS Trainium device: /dev/neuron0 does not exist"


@pytest.fixture(autouse=True, scope="session")
def _private_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's own XDG data directory (polymorph's default board and registry go there)."""
    patch = pytest.MonkeyPatch()
    data = tmp_path_factory.mktemp("xdg-data")
    patch.setenv("XDG_DATA_HOME", str(data))
    for env in ("POLYMORPH_BOARD", "POLYMORPH_REGISTRY"):
        patch.delenv(env, raising=False)
    yield data
    patch.undo()


_DEVICE_MARKERS: dict[str, Callable[[], str | None]] = {
    "cuda": lambda: _torch_gpu_absent(want_hip=False),
    "rocm": lambda: _torch_gpu_absent(want_hip=True),
    "neuron": _neuron_absent,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker, absent in _DEVICE_MARKERS.items():
            if item.get_closest_marker(marker) is None:
                continue
            reason = absent()
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
                break
