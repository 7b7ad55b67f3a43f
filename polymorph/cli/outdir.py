"""Output folders: `compile --out DIR` and `tune --out DIR` never write into a user's folder unasked.

A command takes DIR when it is missing or empty, when it is a previous output of the same command
(recognised by the manifest, `polymorph-out.json`, that the command writes there first), or when the
user passed `--force`. Anything else is refused in one line before a file is written.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from polymorph.errors import UserError

MANIFEST = "polymorph-out.json"
FORMAT = "polymorph-output"


def claim_out(out: str | Path, command: str, *, force: bool = False) -> Path:
    """Make `out` the output folder of `command` ("compile", "tune"): created when missing, refused
    (UserError) when it holds anything that is not a previous output of the same command, unless
    `force`. Writes the manifest; returns the folder."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder; pass a folder path")
    previous = manifest_command(out)
    if out.is_dir() and previous != command and not force:
        try:
            occupied = next(out.iterdir(), None) is not None
        except OSError as e:
            raise UserError(f"cannot read --out {out}: {e.strerror}") from None
        if occupied:
            what = f"a `polymorph {previous}` output" if previous else "not a polymorph output"
            raise UserError(
                f"--out {out} is not empty and is {what}, so `polymorph {command}` would overwrite its "
                f"files; choose an empty or new folder, or pass --force to write into it"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
        if previous != command:
            (out / MANIFEST).write_text(
                json.dumps({"format": FORMAT, "command": command, "created": time.time()}, indent=1) + "\n"
            )
    except OSError as e:
        raise UserError(f"cannot write --out {out}: {e.strerror}") from None
    return out


def manifest_command(out: Path) -> str | None:
    """The command whose output `out` is, by its manifest; None when it has no readable manifest."""
    try:
        data = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("command"), str):
        return None
    return data["command"]
