"""nox sessions for polymorph.

    nox -s tests          CPU tests; what CI runs (.ci/run)
    nox -s lint           ruff, and pyproject's package list against the source folders
    nox -s tests-cuda     device tests on the machine that has the chip; these three run by default
    nox -s tests-rocm     only where the chip is present (nvidia-smi on PATH, /dev/kfd, /dev/neuron0)
    nox -s tests-neuron
    nox -s package        build the wheel, install it into a fresh venv, run the CLI from it
    nox -s demo           install polymorph and run `polymorph demo`
    nox -s bench-cuda     the H200 decode benchmark (BENCHMARKS.md)

Each session wraps a plain command, given in its docstring, that also runs without nox (the GPU
machines have no nox). Arguments after `--` go to pytest or the CLI.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

import nox
from packaging.requirements import Requirement

nox.needs_version = ">=2024.3.2"
# venv rather than uv: pip finds the local CPU build of torch, uv does not.
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"

ROOT = Path(__file__).resolve().parent
CPU = ("-c", "constraints/cpu.txt")
NOT_DEVICE = "not cuda and not rocm and not neuron"

HAS_NVIDIA = shutil.which("nvidia-smi") is not None
HAS_AMD = Path("/dev/kfd").exists()
HAS_NEURON = Path("/dev/neuron0").exists()


@nox.session
def tests(session: nox.Session) -> None:
    """CPU tests, every test without a device marker.

    Plain: pip install -c constraints/cpu.txt -e '.[dev]'
           HYPOTHESIS_PROFILE=ci python -m pytest tests -m "not cuda and not rocm and not neuron"
    """
    session.install(*CPU, "-e", ".[dev]")
    session.run(
        "python",
        "-m",
        "pytest",
        "tests",
        "-m",
        NOT_DEVICE,
        *session.posargs,
        env={"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")},
    )


def _device_tests(session: nox.Session, extra: str) -> None:
    # The venv sees the machine's site-packages, so the vendor's torch/triton/jax builds (a ROCm
    # torch is not on PyPI) are used rather than replaced. From inside a vendor venv, install
    # polymorph there and run `nox -s tests-<chip> --no-venv --no-install`.
    session.install("-e", f".[dev,{extra}]")
    session.run("python", "-m", "pytest", "tests", "-m", extra, *session.posargs)


@nox.session(name="tests-cuda", default=HAS_NVIDIA, venv_params=["--system-site-packages"])
def tests_cuda(session: nox.Session) -> None:
    """Tests marked `cuda`; on a machine without an NVIDIA GPU they skip with the reason.

    Plain: pip install -e '.[dev,cuda]' && python -m pytest tests -m cuda
    (GPU machine: pip install --no-deps --no-build-isolation -e . && python -m pytest tests -m cuda)
    """
    _device_tests(session, "cuda")


@nox.session(name="tests-rocm", default=HAS_AMD, venv_params=["--system-site-packages"])
def tests_rocm(session: nox.Session) -> None:
    """Tests marked `rocm`; on a machine without an AMD GPU they skip with the reason.

    Plain: pip install -e '.[dev,rocm]' && python -m pytest tests -m rocm
    """
    _device_tests(session, "rocm")


@nox.session(name="tests-neuron", default=HAS_NEURON, venv_params=["--system-site-packages"])
def tests_neuron(session: nox.Session) -> None:
    """Tests marked `neuron`; on a machine without Trainium they skip with the reason.

    Plain: pip install -e '.[dev,neuron]' && python -m pytest tests -m neuron
    (neuronx-cc and jax-neuronx come from AWS's package index; see README)
    """
    _device_tests(session, "neuron")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, then pyproject's package list against the folders that hold .py files.

    Plain: ruff check . && ruff format --check . && python noxfile.py
    """
    ruff = _dev_requirement("ruff")
    session.install(ruff)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    problems = package_list_problems()
    if problems:
        session.error("pyproject.toml [tool.setuptools] packages:\n  " + "\n  ".join(problems))


@nox.session(name="bench-cuda", default=False, venv_params=["--system-site-packages"])
def bench_cuda(session: nox.Session) -> None:
    """The H200 decode benchmark against PyTorch eager and torch.compile (BENCHMARKS.md).

    Plain: python bench/decode.py --batch 1 --ctx 1024 8192 --kernels --prefill 2048
    """
    session.install("--no-deps", ".")
    session.run(
        "python",
        "bench/decode.py",
        *(session.posargs or ["--batch", "1", "--ctx", "1024", "8192", "--kernels", "--prefill", "2048"]),
    )


@nox.session(default=False, reuse_venv=False)
def package(session: nox.Session) -> None:
    """Build the wheel, install it into a fresh venv and run the CLI from outside the checkout.

    The wheel is built from a clean copy and checked to hold every source file; it is installed
    with the CPU constraints.

    Plain: pip wheel --no-deps -w /tmp/dist . && python -m venv /tmp/pv
           && /tmp/pv/bin/pip install -c constraints/cpu.txt /tmp/dist/polymorph-*.whl
           && cd /tmp && /tmp/pv/bin/polymorph backends && /tmp/pv/bin/polymorph demo
    """
    work = Path(tempfile.mkdtemp(prefix="polymorph-package-"))
    try:
        src = work / "src"
        # A copy, so that a stale build/ in the checkout cannot leak old files into the wheel.
        shutil.copytree(
            ROOT,
            src,
            ignore=shutil.ignore_patterns(
                ".git", ".nox", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
            ),
        )
        dist = work / "dist"
        session.run(
            "python", "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), str(src), silent=True
        )
        (wheel,) = dist.glob("polymorph-*.whl")
        missing = wheel_problems(wheel)
        if missing:
            session.error(f"{wheel.name} lacks source files:\n  " + "\n  ".join(missing))
        session.install(*CPU, str(wheel))
        outside = work / "run"
        outside.mkdir()
        session.chdir(outside)
        session.run(
            "python",
            "-c",
            "import polymorph, polymorph.backends.cpu; print('polymorph', polymorph.__version__, 'from',"
            " polymorph.__file__)",
        )
        session.run("polymorph", "backends")
        session.run("polymorph", "demo", *session.posargs)
    finally:
        session.chdir(ROOT)
        shutil.rmtree(work, ignore_errors=True)


@nox.session(default=False)
def demo(session: nox.Session) -> None:
    """Install polymorph with the CPU build of torch and run the demo.

    Plain: pip install -c constraints/cpu.txt . && polymorph demo
    """
    session.install(*CPU, ".")
    session.run("polymorph", "demo", *session.posargs)


# --- packaging checks (run in nox's own process, no venv needed) ------------------------------------


def _setuptools_table() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _dev_requirement(name: str) -> str:
    """The `dev` extra's requirement for `name`, so lint runs the ruff that the dev install gets."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in project["optional-dependencies"]["dev"]:
        if Requirement(req).name == name:
            return req
    return name


def _source_roots() -> dict[str, Path]:
    """Package name → folder, for the package-dir roots (polymorph.backends → backends/)."""
    return {pkg: ROOT / folder for pkg, folder in _setuptools_table()["package-dir"].items()}


def _package_folder(package: str, roots: dict[str, Path]) -> Path:
    root = max((r for r in roots if package == r or package.startswith(r + ".")), key=len)
    return roots[root].joinpath(*package[len(root) :].split(".")[1:])


def package_list_problems() -> list[str]:
    """Folders with .py files that are not listed as packages, and listed packages with no files."""
    roots = _source_roots()
    listed = set(_setuptools_table()["packages"])
    found: dict[str, Path] = {}
    for root_pkg, folder in roots.items():
        for py in folder.rglob("*.py"):
            rel = py.parent.relative_to(folder)
            if "__pycache__" in rel.parts or any(p.startswith(".") for p in rel.parts):
                continue
            found[".".join((root_pkg, *rel.parts))] = py.parent
    problems = [
        f"{name} ({path.relative_to(ROOT)}/) holds .py files but is not listed"
        for name, path in sorted(found.items())
        if name not in listed
    ]
    # A listed folder without .py files is fine while it holds data (hwprofiles/ may be only TOML).
    for name in sorted(listed - found.keys()):
        folder = _package_folder(name, roots)
        if not folder.is_dir() or not any(p.is_file() for p in folder.iterdir()):
            problems.append(
                f"{name} is listed but {folder.relative_to(ROOT)}/ does not exist or holds no file"
            )
    return problems


def wheel_problems(wheel: Path) -> list[str]:
    """Source files under the package-dir roots that the wheel does not contain."""
    with zipfile.ZipFile(wheel) as zf:
        inside = set(zf.namelist())
    missing = []
    for root_pkg, folder in _source_roots().items():
        prefix = root_pkg.replace(".", "/")
        for path in folder.rglob("*"):
            rel = path.relative_to(folder)
            if not path.is_file() or "__pycache__" in rel.parts or any(p.startswith(".") for p in rel.parts):
                continue
            if f"{prefix}/{rel.as_posix()}" not in inside:
                missing.append(
                    f"{path.relative_to(ROOT)} (add its folder to packages or its pattern to package-data)"
                )
    return sorted(missing)


if __name__ == "__main__":
    problems = package_list_problems()
    print("\n".join(problems) or "pyproject.toml lists every package")
    sys.exit(1 if problems else 0)
