"""Shared fixtures of the torch.export tests: the test-time model zoo (zoo.py), imported once each."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


def _zoo() -> ModuleType:
    # --import-mode=importlib: a sibling module is loaded by path
    spec = importlib.util.spec_from_file_location("export_zoo", Path(__file__).with_name("zoo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def zoo() -> ModuleType:
    return _zoo()
