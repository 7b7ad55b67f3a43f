"""Arrays in shared memory that the trusted controller creates and the worker maps.

An arena is one file on a tmpfs (`/dev/shm` where it is writable, else the controller's temporary
folder) holding named arrays at 64-byte aligned offsets. The controller creates it, writes it and
keeps its own mapping; the worker maps it by the manifest (`Arena.manifest()`, a JSON-able dict)
read-only (weights: the file is opened O_RDONLY, so no mprotect can make the pages writable) or
read-write (the inputs and outputs of the calls the controller times and checks).

What the worker can change is only what the controller reads back from an arena it gave write
access to; everything else it is handed is the controller's own memory, which it cannot reach.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

ALIGN = 64


def shm_root() -> Path:
    """Where arenas live: a tmpfs (/dev/shm) where one is writable, else the temporary folder."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return Path(tempfile.gettempdir())


def _dtype(name: str) -> np.dtype:
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)


def _dtype_name(dtype: np.dtype) -> str:
    # bfloat16 and the fp8 formats (ml_dtypes) have no numpy type string of their own: by name.
    return dtype.name if dtype.kind == "V" else dtype.str


class Arena:
    """Named arrays in one shared file. `arrays[name]` is a numpy view on this process's mapping."""

    def __init__(self, path: Path, entries: list[dict[str, Any]], size: int, writable: bool) -> None:
        self.path = path
        self.entries = entries
        self.size = size
        self.writable = writable
        flags = os.O_RDWR if writable else os.O_RDONLY
        fd = os.open(path, flags)
        try:
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self._map = mmap.mmap(fd, max(size, 1), access=access)
        finally:
            os.close(fd)
        self.arrays: dict[str, np.ndarray] = {}
        for e in entries:
            dtype = _dtype(e["dtype"])
            count = int(np.prod(e["shape"], dtype=np.int64))
            a = np.frombuffer(self._map, dtype=dtype, count=count, offset=int(e["offset"]))
            self.arrays[e["name"]] = a.reshape(e["shape"])

    @classmethod
    def create(cls, folder: Path, name: str, specs: Iterable[tuple[str, np.dtype, tuple[int, ...]]]) -> Arena:
        """A new arena file `folder/name` sized for `specs` (name, dtype, shape), zero-filled."""
        entries, offset = [], 0
        for key, dtype, shape in specs:
            dtype = np.dtype(dtype)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            entries.append({"name": key, "dtype": _dtype_name(dtype), "shape": list(shape), "offset": offset})
            offset += -(-max(nbytes, 1) // ALIGN) * ALIGN
        path = Path(folder) / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(offset, 1))
        finally:
            os.close(fd)
        return cls(path, entries, offset, writable=True)

    @classmethod
    def of(cls, folder: Path, name: str, arrays: Mapping[str, np.ndarray]) -> Arena:
        """A new arena holding copies of `arrays`."""
        arena = cls.create(folder, name, [(k, a.dtype, tuple(a.shape)) for k, a in arrays.items()])
        for k, a in arrays.items():
            arena.arrays[k][...] = a
        return arena

    @classmethod
    def open(cls, manifest: Mapping[str, Any], *, writable: bool) -> Arena:
        return cls(Path(manifest["path"]), list(manifest["entries"]), int(manifest["size"]), writable)

    def manifest(self) -> dict[str, Any]:
        return {"path": str(self.path), "entries": self.entries, "size": self.size}

    def close(self) -> None:
        self.arrays.clear()
        try:
            self._map.close()
        except BufferError:  # a view is still held somewhere: the mapping goes with the last of them
            pass

    def unlink(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
