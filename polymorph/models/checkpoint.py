"""safetensors checkpoints in pure numpy: read, write, and Hugging Face model directories.

The format: an 8-byte little-endian u64 header length N, N bytes of a JSON header
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}` (metadata
optional), then the little-endian data buffer; offsets are relative to the buffer. Reading maps the
file read-only and returns zero-copy views. A model directory holds either `model.safetensors` or
shards listed in `model.safetensors.index.json` (`{"metadata": {...}, "weight_map": {name: file}}`).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from polymorph.errors import UserError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# safetensors dtype name -> numpy dtype (little-endian, as the format stores it)
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype(np.bool_),
}
_NAMES: dict[np.dtype, str] = {dt: n for n, dt in DTYPES.items()}
_MAX_HEADER = 100_000_000  # the limit the safetensors library enforces
_SHARD_NAME = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of one .safetensors file, as read-only zero-copy views of a memory map.

    Raises UserError naming the file for a bad or truncated header, an unsupported dtype, or a data
    buffer shorter than the header says.
    """
    path = Path(path)
    header, data_start = _read_header(path)
    if not header:
        return {}
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out: dict[str, np.ndarray] = {}
    for name, (dtype, shape, begin, end) in header.items():
        out[name] = mm[data_start + begin : data_start + end].view(dtype).reshape(shape)
    return out


def read_safetensors_metadata(path: str | Path) -> dict[str, str]:
    """The `__metadata__` map of one .safetensors file (empty if it has none)."""
    path = Path(path)
    raw, _ = _read_raw_header(path)
    return dict(raw.get("__metadata__") or {})


def write_safetensors(
    path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> None:
    """Write `tensors` to one .safetensors file that the safetensors library and transformers read.

    The header is padded with spaces to a multiple of 8 bytes, and tensors are laid out by decreasing
    item size, so every tensor starts aligned to its item size. Arrays are written as C-contiguous
    little-endian data. The file is written to a temporary name and renamed into place.
    """
    path = Path(path)
    arrays: dict[str, tuple[str, np.ndarray]] = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise UserError(
                f"{path}: tensor name {name!r} is not allowed; use a string other than __metadata__"
            )
        arr = np.asarray(value)
        arrays[name] = (_dtype_name(arr.dtype, name, path), _little_endian_contiguous(arr))
    if metadata is not None and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise UserError(f"{path}: safetensors metadata must map strings to strings, got {metadata!r}")

    order = sorted(arrays, key=lambda n: (-arrays[n][1].dtype.itemsize, n))
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name in order:
        dtype_name, arr = arrays[name]
        header[name] = {
            "dtype": dtype_name,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)

    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(len(header_bytes).to_bytes(8, "little"))
        f.write(header_bytes)
        for name in order:
            arr = arrays[name][1]
            if arr.size:
                f.write(arr.reshape(-1).view(np.uint8).data)
    os.replace(tmp, path)


def list_checkpoint(model_dir: str | Path) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Name -> (dtype, shape) of every tensor of a model directory (or one .safetensors file).

    Reads only the headers. Raises UserError as `load_checkpoint` does.
    """
    out: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    for path, wanted in _checkpoint_files(Path(model_dir)):
        header, _ = _read_header(path)
        _check_listed(path, header, wanted)
        for name, (dtype, shape, _, _) in header.items():
            _add(out, name, (dtype, shape), path)
    return out


def load_checkpoint(model_dir: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a model directory (or one .safetensors file), by its Hugging Face name.

    A directory with `model.safetensors.index.json` is read shard by shard; otherwise it must hold
    `model.safetensors`. Tensors are read-only views of memory maps. Tied output embeddings are not
    duplicated: `lm_head.weight` is absent when the checkpoint does not store it. Raises UserError
    naming the file for: no checkpoint, a bad index, a missing shard, a tensor the index lists but its
    shard lacks, a tensor in two shards, an unsupported dtype, a bad header or a truncated file.
    """
    out: dict[str, np.ndarray] = {}
    for path, wanted in _checkpoint_files(Path(model_dir)):
        tensors = read_safetensors(path)
        _check_listed(path, tensors, wanted)
        for name, arr in tensors.items():
            _add(out, name, arr, path)
    return out


def save_checkpoint(
    model_dir: str | Path,
    tensors: dict[str, np.ndarray],
    shard_bytes: int | None = None,
    metadata: dict[str, str] | None = None,
) -> list[Path]:
    """Write `tensors` as a Hugging Face checkpoint in `model_dir` (created if needed); the files written.

    With `shard_bytes` None, or all tensors fitting in it, one `model.safetensors`; otherwise shards
    `model-0000K-of-0000N.safetensors` of at most `shard_bytes` each (a larger tensor gets its own
    shard), filled in the order of `tensors`, plus `model.safetensors.index.json`. Every file carries
    metadata {"format": "pt"} (transformers requires it) updated with `metadata`. A checkpoint already
    in the directory (the single file, the index, `model-*-of-*.safetensors` shards) is replaced.
    """
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    meta = {"format": "pt", **(metadata or {})}
    sizes = {name: np.asarray(arr).nbytes for name, arr in tensors.items()}
    total = sum(sizes.values())

    groups: list[list[str]] = [[]]
    if shard_bytes is not None and total > shard_bytes:
        if shard_bytes <= 0:
            raise UserError(f"{model_dir}: shard_bytes must be positive, got {shard_bytes}")
        used = 0
        for name in tensors:
            if groups[-1] and used + sizes[name] > shard_bytes:
                groups.append([])
                used = 0
            groups[-1].append(name)
            used += sizes[name]
    else:
        groups[0] = list(tensors)

    for old in model_dir.iterdir():
        if old.name in (SINGLE_FILE, INDEX_FILE) or _SHARD_NAME.match(old.name):
            old.unlink()

    if len(groups) == 1:
        path = model_dir / SINGLE_FILE
        write_safetensors(path, tensors, meta)
        return [path]
    written: list[Path] = []
    weight_map: dict[str, str] = {}
    for k, group in enumerate(groups, 1):
        path = model_dir / f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        write_safetensors(path, {name: tensors[name] for name in group}, meta)
        weight_map.update(dict.fromkeys(group, path.name))
        written.append(path)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    index_path = model_dir / INDEX_FILE
    index_path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    written.append(index_path)
    return written


# name -> (dtype, shape, begin, end), offsets relative to the data buffer
_Header = dict[str, tuple[np.dtype, tuple[int, ...], int, int]]


def _read_raw_header(path: Path) -> tuple[dict[str, Any], int]:
    """The parsed JSON header and the file offset where the data buffer starts."""
    try:
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise UserError(f"{path}: truncated safetensors file ({len(prefix)} bytes); re-download it")
            n = int.from_bytes(prefix, "little")
            if n > _MAX_HEADER:
                raise UserError(
                    f"{path}: bad safetensors header length {n}; the file is not safetensors or is corrupt"
                )
            raw = f.read(n)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a .safetensors file") from None
    if len(raw) < n:
        raise UserError(f"{path}: truncated safetensors header ({len(raw)} of {n} bytes); re-download it")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise UserError(f"{path}: bad safetensors header, not JSON ({e}); the file is corrupt") from None
    if not isinstance(header, dict):
        raise UserError(f"{path}: bad safetensors header, expected a JSON object")
    meta = header.get("__metadata__")
    if meta is not None and not (
        isinstance(meta, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    ):
        raise UserError(f"{path}: bad safetensors header, __metadata__ must map strings to strings")
    return header, 8 + n


def _read_header(path: Path) -> tuple[_Header, int]:
    """The validated tensor entries of a file's header and the file offset of its data buffer."""
    raw, data_start = _read_raw_header(path)
    buffer_len = path.stat().st_size - data_start
    out: _Header = {}
    for name, entry in raw.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise UserError(f"{path}: bad safetensors header entry for tensor {name!r}: {entry!r}")
        dtype_name, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype_name not in DTYPES:
            raise UserError(
                f"{path}: tensor {name!r} has dtype {dtype_name!r}, which polymorph does not read; "
                f"supported: {', '.join(DTYPES)}"
            )
        if not (isinstance(shape, list) and all(_is_uint(d) for d in shape)):
            raise UserError(f"{path}: bad safetensors header, tensor {name!r} has shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_uint(o) for o in offsets)):
            raise UserError(f"{path}: bad safetensors header, tensor {name!r} has data_offsets {offsets!r}")
        dtype = DTYPES[dtype_name]
        begin, end = offsets
        if end - begin != math.prod(shape) * dtype.itemsize:
            raise UserError(
                f"{path}: bad safetensors header, tensor {name!r} of shape {shape} {dtype_name} needs "
                f"{math.prod(shape) * dtype.itemsize} bytes but data_offsets span {end - begin}"
            )
        if end > buffer_len:
            raise UserError(
                f"{path}: truncated safetensors file: tensor {name!r} ends at byte {data_start + end} but the "
                f"file has {data_start + buffer_len}; re-download it"
            )
        out[name] = (dtype, tuple(shape), begin, end)
    return out, data_start


def _is_uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _checkpoint_files(model_dir: Path) -> list[tuple[Path, set[str] | None]]:
    """The .safetensors files of a checkpoint, each with the names the index assigns to it (None: any)."""
    if model_dir.is_file():
        return [(model_dir, None)]
    if not model_dir.is_dir():
        raise UserError(f"{model_dir}: no such model directory")
    index_path = model_dir / INDEX_FILE
    if not index_path.exists():
        single = model_dir / SINGLE_FILE
        if not single.exists():
            raise UserError(
                f"{model_dir}: no {SINGLE_FILE} or {INDEX_FILE}; point at a Hugging Face model directory "
                "with safetensors weights"
            )
        return [(single, None)]
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise UserError(
            f"{index_path}: cannot read the checkpoint index ({e}); fix or re-download it"
        ) from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise UserError(f"{index_path}: bad checkpoint index, expected a `weight_map` of tensor name -> file")
    by_file: dict[str, set[str]] = {}
    for name, file in weight_map.items():
        by_file.setdefault(file, set()).add(name)
    out: list[tuple[Path, set[str] | None]] = []
    for file in sorted(by_file):
        path = model_dir / file
        if Path(file).name != file:
            raise UserError(f"{index_path}: shard {file!r} is not a file name in the model directory")
        if not path.is_file():
            raise UserError(
                f"{path}: shard listed in {index_path.name} is missing; re-download the checkpoint"
            )
        out.append((path, by_file[file]))
    return out


def _check_listed(path: Path, present: dict[str, Any], wanted: set[str] | None) -> None:
    if wanted is None:
        return
    missing = sorted(wanted - present.keys())
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise UserError(
            f"{path}: the index lists {shown} in this shard but the file lacks it; re-download the checkpoint"
        )


def _add(out: dict[str, Any], name: str, value: Any, path: Path) -> None:
    if name in out:
        raise UserError(
            f"{path}: tensor {name!r} also appears in another shard; the checkpoint is inconsistent"
        )
    out[name] = value


def _dtype_name(dtype: np.dtype, name: str, path: Path) -> str:
    found = _NAMES.get(dtype.newbyteorder("<"))
    if found is None:
        raise UserError(
            f"{path}: tensor {name!r} has dtype {dtype}, which safetensors cannot store; "
            f"supported: {', '.join(str(d) for d in DTYPES.values())}"
        )
    return found


def _little_endian_contiguous(arr: np.ndarray) -> np.ndarray:
    arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")
