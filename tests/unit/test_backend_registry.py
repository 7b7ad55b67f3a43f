"""The backend registry: in-tree discovery, entry points, failures remembered and raised only by name."""

from __future__ import annotations

import importlib.metadata
import sys
import types

import pytest

from polymorph.errors import UserError
from polymorph.pipeline.backend import Backend, Registry, registry


def test_in_tree_backends_are_found_and_probe_honestly() -> None:
    names = registry.names()
    assert {"cpu", "cuda", "rocm", "neuron"} <= set(names)
    for name, backend, failure in registry.available():
        assert backend is not None, f"{name}: {failure}"
        probe = backend.probe()
        for cap in (probe.compile, probe.run, probe.measure):
            assert cap.ok or cap.reason, f"{name}: a capability that is off must say why"
    assert registry.get("cpu").probe().run.ok


def test_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(UserError, match="unknown backend `tpu`; backends: cpu, cuda, rocm, neuron"):
        registry.get("tpu")


class _EntryPoint:
    def __init__(self, name: str, value: str) -> None:
        self.name, self.value = name, value


def _fake_entry_points(monkeypatch: pytest.MonkeyPatch, eps: list[_EntryPoint]) -> None:
    def entry_points(group: str):
        return eps if group == "polymorph.backends" else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_third_party_backend_through_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_cls = type(registry.get("cpu"))
    module = types.ModuleType("acme_backend")

    class AcmeBackend(cpu_cls):  # type: ignore[misc, valid-type]
        name = "acme"

    module.AcmeBackend = AcmeBackend
    monkeypatch.setitem(sys.modules, "acme_backend", module)
    _fake_entry_points(monkeypatch, [_EntryPoint("acme", "acme_backend:AcmeBackend")])
    reg = Registry()
    assert "acme" in reg.names()
    assert isinstance(reg.get("acme"), Backend)
    assert reg.get("acme").name == "acme"


def test_a_broken_backend_is_remembered_and_raised_only_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, [_EntryPoint("broken", "no_such_module_for_polymorph:Thing")])
    reg = Registry()
    listed = {name: (b, why) for name, b, why in reg.available()}  # survives the broken one
    assert listed["cpu"][0] is not None
    assert listed["broken"][0] is None and "ModuleNotFoundError" in listed["broken"][1]
    with pytest.raises(UserError, match="backend `broken` failed to load: ModuleNotFoundError"):
        reg.get("broken")


def test_reload_gives_a_fresh_backend_class() -> None:
    reg = Registry()
    before = type(reg.get("cpu"))
    after = type(reg.reload("cpu"))
    assert after is not before and after.name == "cpu"
