"""The persistent engine: a worker process per device (`worker`), the trusted controller that drives
it and compares against the reference (`controller`), and the JSON-lines protocol between them
(`protocol`). `Controller` is the Python client."""

from __future__ import annotations

from typing import Any

__all__ = ["Controller"]


def __getattr__(name: str) -> Any:
    # Lazy: `python -m polymorph.engine.worker` must not import the controller side.
    if name == "Controller":
        from polymorph.engine.controller import Controller

        return Controller
    raise AttributeError(name)
