"""Where hardware profiles are: the shipped `hwprofiles/` and the directories POLYMORPH_PROFILES adds.

A chip is known because a profile file names it: `<dir>/<id>.toml` with a `target = "family:arch"`
line. This module finds the files and reads each one's `target` text, nothing more: target.py builds
the accepted archs from it and profile.py loads and validates the files. It imports neither (target.py
is imported by profile.py), so the set of known targets follows the files without an import cycle.

Each file's text is read once per (size, mtime): Target construction asks for the archs often, and a
profile edited on disk (or a directory added through the knob) is seen at the next call.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
import tomllib
from importlib.resources.abc import Traversable
from pathlib import Path

from polymorph.errors import UserError
from polymorph.knobs import knobs


@functools.cache  # where the package lies does not change while it runs
def shipped_dir() -> Traversable:
    """The profiles shipped with polymorph: the `polymorph.hwprofiles` package when installed (wheel or
    editable, through setuptools' package-dir), else `hwprofiles/` beside `polymorph/` in a checkout."""
    try:
        return importlib.resources.files("polymorph.hwprofiles")
    except ModuleNotFoundError:
        # A plain checkout: nothing maps hwprofiles/ into the polymorph package until it is installed.
        return Path(__file__).resolve().parents[2] / "hwprofiles"


def profile_dirs() -> list[Traversable]:
    """The shipped directory, then each POLYMORPH_PROFILES directory in order. A knob directory that
    does not exist is a UserError naming it."""
    extra: list[Traversable] = []
    for folder in knobs.profile_dirs:
        if not folder.is_dir():
            raise UserError(
                f"POLYMORPH_PROFILES names `{folder}`, which is not a directory; create it or fix the variable"
            )
        extra.append(folder)
    return [shipped_dir(), *extra]


def profile_files() -> dict[str, Traversable]:
    """Profile id (the file's stem) -> its file, over every profile directory. An id found in two
    directories is a UserError naming both files: a profile is never silently shadowed."""
    return {pid: entry for pid, (entry, _) in _scan().items()}


def _scan() -> dict[str, tuple[Traversable, tuple[int, int] | None]]:
    """Profile id -> (file, (size, mtime_ns) where it is a real file)."""
    found: dict[str, tuple[Traversable, tuple[int, int] | None]] = {}
    for folder in profile_dirs():
        if isinstance(folder, Path):  # one stat per file: Target construction calls this often
            with os.scandir(folder) as it:
                entries = [
                    (Path(e.path), (st.st_size, st.st_mtime_ns))
                    for e in it
                    if e.name.endswith(".toml") and e.is_file()
                    for st in (e.stat(),)
                ]
        else:  # a zipped wheel's resources
            entries = [(e, None) for e in folder.iterdir() if e.name.endswith(".toml") and e.is_file()]
        for entry, key in sorted(entries, key=lambda e: e[0].name):
            pid = entry.name[: -len(".toml")]
            if pid in found:
                raise UserError(
                    f"profile `{pid}` is defined twice: {found[pid][0]} and {entry}; rename one "
                    f"(a profile's id is its file name)"
                )
            found[pid] = (entry, key)
    return found


def profile_targets() -> dict[str, str]:
    """Profile id -> the `target` text its file names, for every profile file that is valid TOML with
    a string `target`. Others are left out here; loading them by id reports what is wrong."""
    out: dict[str, str] = {}
    for pid, (entry, key) in _scan().items():
        target = _target_of(entry, key)
        if target is not None:
            out[pid] = target
    return out


_SEEN: dict[str, tuple[tuple[int, int], str | None]] = {}  # path -> ((size, mtime_ns), target text)
_UNREADABLE: dict[str, str] = {}  # path -> why no target could be read from it


def unreadable_profiles() -> dict[str, str]:
    """Profile files (path -> reason) that `profile_targets` left out at its last scan: broken TOML,
    unreadable, or without a `target`. Errors about an unknown chip name them, so a typo in a user's
    profile is not mistaken for a missing one."""
    live = {str(entry) for entry, _ in _scan().values()}
    return {path: why for path, why in sorted(_UNREADABLE.items()) if path in live}


def _target_of(entry: Traversable, key: tuple[int, int] | None) -> str | None:
    seen = _SEEN.get(str(entry)) if key is not None else None
    if seen is not None and seen[0] == key:
        return seen[1]
    try:
        data = tomllib.loads(entry.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        target = None
        _UNREADABLE[str(entry)] = f"{type(exc).__name__}: {exc}"
    else:
        _UNREADABLE.pop(str(entry), None)
        raw = data.get("target")
        target = raw.strip() if isinstance(raw, str) and raw.strip() else None
        if target is None:
            _UNREADABLE[str(entry)] = "no string `target` field"
    if key is not None:
        _SEEN[str(entry)] = (key, target)
    return target
