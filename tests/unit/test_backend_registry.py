"""The backend registry: in-tree backends found by reading the backends folder, entry points (hyphenated
names too), failures remembered and raised only by name. The real entry-point path (a distribution on
sys.path) is tests/unit/test_toy_backend.py."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import types
from pathlib import Path

import pytest

from polymorph.errors import UserError
from polymorph.pipeline.backend import Backend, Feature, Registry, binds_backend, in_tree_sources, registry

BACKENDS_DIR = Path(__file__).resolve().parents[2] / "backends"


def test_in_tree_backends_are_found_and_probe_honestly() -> None:
    names = registry.names()
    assert {"cpu", "cuda", "rocm", "neuron"} <= set(names)
    for name, backend, failure in registry.available():
        assert backend is not None, f"{name}: {failure}"
        assert backend.name == name
        probe = backend.probe()
        for cap in (probe.compile, probe.run, probe.measure):
            assert cap.ok or cap.reason, f"{name}: a capability that is off must say why"
    assert registry.get("cpu").probe().run.ok


def test_the_backends_folder_is_scanned_not_listed() -> None:
    """Every package of backends/ that binds BACKEND is a backend; the shared glue (gpu/) and the
    modules beside them (device_probe.py, torch_bridge.py) are not, and none of them is imported."""
    packages = {p.name for p in BACKENDS_DIR.iterdir() if (p / "__init__.py").is_file()}
    binding = {name for name in packages if "BACKEND =" in (BACKENDS_DIR / name / "__init__.py").read_text()}
    assert "gpu" in packages and "gpu" not in binding  # the oracle sees the glue the scan must skip
    found = in_tree_sources([str(BACKENDS_DIR)])
    assert set(found) == binding
    assert not {"gpu", "device_probe", "torch_bridge"} & set(found)
    assert all(s.module == f"polymorph.backends.{n}" and s.attr == "BACKEND" for n, s in found.items())
    assert set(in_tree_sources()) == binding  # the installed package's folder is this checkout's
    # Listing imports no backend (a fresh interpreter: this one has imported them all by now).
    listing = (
        "import sys; from polymorph.pipeline.backend import registry; names = registry.names(); "
        "print(','.join(names)); print(sorted(m for m in sys.modules if m.startswith('polymorph.backends.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", listing], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.splitlines() == [",".join(sorted(binding)), "[]"], out.stdout + out.stderr


def test_a_new_folder_becomes_a_backend_and_glue_does_not(tmp_path: Path) -> None:
    def package(name: str, init: str) -> None:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(init)

    package("newchip", "from polymorph.backends.cpu import CpuBackend\n\nBACKEND = CpuBackend\n")
    package("annotated", "BACKEND: type = object\n")
    package("imported", "from .backend import NewChip as BACKEND\n")
    package("glue", '"""Shared code, no backend."""\nX = 1\n')
    package("broken", "BACKEND = (\n")  # does not parse: listed, so that asking for it says why
    package("nested", "def f():\n    BACKEND = 1\n")  # not a top-level binding
    (tmp_path / "module.py").write_text("BACKEND = None\n")  # a module, not a package
    (tmp_path / "no_init").mkdir()
    assert list(in_tree_sources([str(tmp_path)])) == ["annotated", "broken", "imported", "newchip"]
    assert not binds_backend(tmp_path / "missing" / "__init__.py")


def test_unknown_backend_lists_the_known_ones() -> None:
    known = ", ".join(registry.names())
    with pytest.raises(UserError, match=f"unknown backend `tpu`; backends: {known}$"):
        registry.get("tpu")


def _fake_entry_points(monkeypatch: pytest.MonkeyPatch, eps: dict[str, str]) -> None:
    """Entry points of group polymorph.backends, as `name = value` lines of entry_points.txt say."""
    group = "polymorph.backends"
    real = [importlib.metadata.EntryPoint(name, value, group) for name, value in eps.items()]

    def entry_points(group: str):  # type: ignore[no-untyped-def]
        return real if group == "polymorph.backends" else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def _module_with(monkeypatch: pytest.MonkeyPatch, module_name: str, **classes: type) -> None:
    module = types.ModuleType(module_name)
    for attr, cls in classes.items():
        setattr(module, attr, cls)
    monkeypatch.setitem(sys.modules, module_name, module)


def _cpu_subclass(name: str) -> type[Backend]:
    return type(f"Backend_{name.replace('-', '_')}", (type(registry.get("cpu")),), {"name": name})


def test_third_party_backend_through_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    _module_with(monkeypatch, "acme_backend", AcmeBackend=_cpu_subclass("acme"))
    _module_with(monkeypatch, "mychip", BACKEND=_cpu_subclass("my-chip"))
    _fake_entry_points(monkeypatch, {"acme": "acme_backend:AcmeBackend", "my-chip": "mychip"})
    reg = Registry()
    assert reg.names()[-2:] == ["acme", "my-chip"]  # after the in-tree ones
    assert isinstance(reg.get("acme"), Backend) and reg.get("acme").name == "acme"
    assert reg.get("my-chip").name == "my-chip"  # a module-only value: its BACKEND
    assert reg.source("my-chip").origin.startswith("entry point `mychip`")


def test_a_broken_backend_is_remembered_and_raised_only_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    _module_with(monkeypatch, "misnamed_chip", BACKEND=_cpu_subclass("other-name"), NotOne=int)
    _fake_entry_points(
        monkeypatch,
        {
            "broken": "no_such_module_for_polymorph:Thing",
            "misnamed": "misnamed_chip",
            "not-a-backend": "misnamed_chip:NotOne",
            "cpu": "misnamed_chip",  # an entry point may not replace an in-tree backend
            "bad name": "misnamed_chip",
        },
    )
    reg = Registry()
    names = reg.names()
    assert "bad name" not in names and names.count("cpu") == 1
    rows = reg.available()  # survives the broken ones
    listed = {name: (b, why) for name, b, why in rows[: len(names)]}
    unlisted = {name: why for name, b, why in rows[len(names) :] if b is None}
    assert isinstance(listed["cpu"][0], type(registry.get("cpu")))  # the in-tree one, not the module
    assert listed["broken"][0] is None and "ModuleNotFoundError" in listed["broken"][1]
    assert "calls itself `other-name`" in listed["misnamed"][1]
    assert "not a polymorph Backend subclass" in listed["not-a-backend"][1]
    assert set(unlisted) == {"cpu", "bad name"}
    assert "shadowed by the in-tree backend" in unlisted["cpu"]
    assert "not a backend name" in unlisted["bad name"]
    with pytest.raises(UserError, match="backend `broken` failed to load: ModuleNotFoundError"):
        reg.get("broken")
    with pytest.raises(UserError, match="registered as `misnamed`"):
        reg.get("misnamed")


def test_features_name_the_backends_that_have_them() -> None:
    engine = registry.with_feature(Feature.ENGINE)
    assert engine == [n for n, b, _ in registry.available() if b is not None and Feature.ENGINE in b.features]
    assert "cpu" in engine


def test_reload_gives_a_fresh_backend_class() -> None:
    reg = Registry()
    before = type(reg.get("cpu"))
    after = type(reg.reload("cpu"))
    assert after is not before and after.name == "cpu"
