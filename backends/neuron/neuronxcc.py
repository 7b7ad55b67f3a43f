"""neuronx-cc: the command line polymorph runs, and the content-hashed compile cache around it.

The command is the one AWS's Neuron documentation gives for compiling an XLA HLO module to a NEFF
(compiler/neuronx-cc how-to-generate-neff and the CLI reference guide):

    neuronx-cc compile model.hlo.pb --framework XLA --target trn2 --model-type transformer \
        --auto-cast none --output model.neff

  --framework XLA             the input is an HLO module proto (what JAX lowers to)
  --target trn2               the instance family
  --model-type transformer    the documented optimization profile for transformer models (AWS's own
                              trn2 inference caches, e.g. optimum-neuron's, record exactly these flags)
  --auto-cast none            keep the module's dtypes: the plan's numerics are the reference's, and
                              letting the compiler cast f32 matmuls to bf16 would change them
  --output model.neff         the NEFF the Neuron runtime loads
The logical NeuronCore config is left at the compiler's trn2 default (LNC=2).

Cache (see backends/neuron/README.md): `knobs.cache_dir / "neuron" / key[:2] / key /`, where key is
the sha256 of the module's HLO text, the flags and the compiler version ("none" without one). A
group whose code or shapes changed gets a new key and compiles alone; unchanged groups hit.

Nothing here has been run against a real neuronx-cc: it is written against the documentation and
tested with a stand-in executable that records its arguments.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polymorph.errors import UserError

EXECUTABLE = "neuronx-cc"
NEURON_PIP_INDEX = "https://pip.repos.neuron.amazonaws.com"
INSTALL_NEURONX_CC = f"pip install neuronx-cc --extra-index-url={NEURON_PIP_INDEX}"
NEFF_NOT_BUILT = (
    f"NEFF not built: neuronx-cc is not installed; install from AWS's Neuron repository: {INSTALL_NEURONX_CC}"
)


def flags(target: str = "trn2") -> tuple[str, ...]:
    return ("--framework", "XLA", "--target", target, "--model-type", "transformer", "--auto-cast", "none")


def command(hlo_pb: str, neff: str, target: str = "trn2") -> list[str]:
    """The neuronx-cc command line that compiles `hlo_pb` to `neff` for `target`."""
    return [EXECUTABLE, "compile", hlo_pb, *flags(target), "--output", neff]


def installed() -> bool:
    return shutil.which(EXECUTABLE) is not None


@functools.cache
def _version(path: str) -> str:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    text = (done.stdout or done.stderr).strip().splitlines()
    return text[-1].strip() if text else "unknown"


def version() -> str | None:
    """`neuronx-cc --version` (once per executable path), or None when it is not installed."""
    path = shutil.which(EXECUTABLE)
    return None if path is None else _version(path)


@dataclass(frozen=True)
class CacheEntry:
    key: str
    path: Path

    @property
    def hlo_pb(self) -> Path:
        return self.path / "module.hlo.pb"

    @property
    def hlo_text(self) -> Path:
        return self.path / "module.hlo.txt"

    @property
    def neff(self) -> Path:
        return self.path / "model.neff"

    @property
    def log(self) -> Path:
        return self.path / "neuronx-cc.log"


class CompileCache:
    """HLO modules and their NEFFs by content hash, under `root` (default knobs.cache_dir/neuron)."""

    def __init__(self, root: Path | None = None, target: str = "trn2") -> None:
        if root is None:
            from polymorph.knobs import knobs

            root = Path(knobs.cache_dir) / "neuron"
        self.root = root
        self.target = target
        self.compiler = version()
        self.compiles = 0  # neuronx-cc runs made through this cache object (tests read it)

    def key(self, hlo_text: str) -> str:
        h = hashlib.sha256()
        for part in (hlo_text, json.dumps(flags(self.target)), self.compiler or "none"):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def entry(self, key: str) -> CacheEntry:
        return CacheEntry(key, self.root / key[:2] / key)

    def put(self, hlo_text: str, hlo_proto: bytes, meta: dict[str, Any]) -> CacheEntry:
        """Store a module (once per key); `meta` (what it is: group ids, kernel) goes to entry.json."""
        entry = self.entry(self.key(hlo_text))
        if not entry.hlo_pb.exists():
            entry.path.mkdir(parents=True, exist_ok=True)
            _write_atomic(entry.hlo_text, hlo_text.encode())
            _write_atomic(entry.hlo_pb, hlo_proto)
            record = {
                "key": entry.key,
                "flags": list(flags(self.target)),
                "compiler": self.compiler,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **meta,
            }
            _write_atomic(entry.path / "entry.json", (json.dumps(record, indent=1) + "\n").encode())
        return entry

    def build_neff(self, entry: CacheEntry, what: str) -> bool:
        """Compile an entry's module to its NEFF unless it is there; True when neuronx-cc ran."""
        if entry.neff.exists():
            return False
        if not installed():
            raise UserError(f"{what}: {NEFF_NOT_BUILT}")
        partial = entry.path / f"model.neff.{os.getpid()}.partial"
        cmd = command(entry.hlo_pb.name, partial.name, self.target)
        with entry.log.open("w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            done = subprocess.run(cmd, cwd=entry.path, stdout=log, stderr=subprocess.STDOUT)
        self.compiles += 1
        if done.returncode != 0 or not partial.exists():
            raise UserError(
                f"{what}: neuronx-cc failed (exit {done.returncode}); its log is {entry.log}: {_last_line(entry.log)}"
            )
        partial.replace(entry.neff)
        return True


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"
