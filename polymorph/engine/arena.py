"""Arrays in shared memory that the trusted controller creates and the worker maps.

An arena holds named arrays at 64-byte aligned offsets in one shared object the controller creates,
writes and keeps its own mapping of:

- weights: a file in the engine's folder, which the sandbox lets a worker read and not write; the
  worker opens it O_RDONLY, so no mprotect can make its pages writable;
- the inputs and outputs of the calls the controller times and checks: a memfd sealed against
  shrinking and growing (so a worker can never make the controller's mapping fault), handed to the
  worker over its socket (SCM_RIGHTS), never a path another worker could replace.

What the worker can change is only what the controller copies back out of an io arena, while the
worker is frozen; everything else it is handed is the controller's own memory, which it cannot reach.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

ALIGN = 64


def _dtype(name: str) -> np.dtype:
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)


def _dtype_name(dtype: np.dtype) -> str:
    # bfloat16 and the fp8 formats (ml_dtypes) have no numpy type string of their own: by name.
    return dtype.name if dtype.kind == "V" else dtype.str


class Arena:
    """Named arrays in one shared file. `arrays[name]` is a numpy view on this process's mapping."""

    def __init__(
        self, path: Path, entries: list[dict[str, Any]], size: int, writable: bool, fd: int | None = None
    ) -> None:
        self.path = path
        self.entries = entries
        self.size = size
        self.writable = writable
        self.fd: int | None = None  # a memfd arena keeps its descriptor, to hand to workers
        if fd is None:
            fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
            own = True
        else:
            own = False
        try:
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self._map = mmap.mmap(fd, max(size, 1), access=access)
        finally:
            if own:
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
        entries, offset = _layout(specs)
        path = Path(folder) / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(offset, 1))
        finally:
            os.close(fd)
        return cls(path, entries, offset, writable=True)

    @classmethod
    def sealed(cls, name: str, specs: Iterable[tuple[str, np.dtype, tuple[int, ...]]]) -> Arena:
        """A new io arena in a memfd sealed at its size (zero-filled): pass `fd` to a worker."""
        import fcntl

        entries, size = _layout(specs)
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, max(size, 1))
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            arena = cls(Path(f"memfd:{name}"), entries, size, writable=True, fd=fd)
        except BaseException:
            os.close(fd)
            raise
        arena.fd = fd
        return arena

    @classmethod
    def from_fd(cls, fd: int, entries: list[dict[str, Any]], size: int) -> Arena:
        """The worker's mapping of an io arena it was handed (the descriptor is closed once mapped)."""
        try:
            return cls(Path(f"fd:{fd}"), entries, size, writable=True, fd=fd)
        finally:
            os.close(fd)

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
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def unlink(self) -> None:
        self.close()
        if not str(self.path).startswith(("memfd:", "fd:")):
            self.path.unlink(missing_ok=True)


def _layout(specs: Iterable[tuple[str, np.dtype, tuple[int, ...]]]) -> tuple[list[dict[str, Any]], int]:
    entries, offset = [], 0
    for key, dtype, shape in specs:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        entries.append({"name": key, "dtype": _dtype_name(dtype), "shape": list(shape), "offset": offset})
        offset += -(-max(nbytes, 1) // ALIGN) * ALIGN
    return entries, offset


def slots_digest(
    arrays: Mapping[str, np.ndarray], calls: Iterable[tuple[Iterable[str | None], Iterable[str | None]]]
) -> str:
    """A digest of every named slot of a request's calls, per call its outputs then its inputs (None,
    a weight or a cache written in place, skipped), bytes and names alike.

    The worker sends it with its answer over what its slots hold at that instant; the controller
    computes it again over what it copies out once the worker is frozen. Equal digests mean nothing
    was written after the answer: work finished later (a child process, a thread, a device queue)
    would change the bytes. Forging the digest needs the final bytes, i.e. the work done before the
    answer, inside the controller's clock."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for outs, ins in calls:
        for name in [*outs, *ins]:
            if name is not None:
                h.update(name.encode())
                h.update(np.ascontiguousarray(arrays[name]).view(np.uint8).data)
    return h.hexdigest()
