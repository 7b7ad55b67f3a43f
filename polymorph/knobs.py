"""Every `POLYMORPH_*` environment variable, typed, in one place.

This is the only module that reads `POLYMORPH_*` variables. Code asks `knobs.<name>` each time it needs
a value: a knob is read from the environment at access time, never cached at import, so a variable set
after import (or inside `knobs.scope(...)`) is seen by the next access.

    from polymorph.knobs import knobs
    knobs.kv_block_size                      # 16, or int(POLYMORPH_KV_BLOCK_SIZE)
    with knobs.scope(seed=3, plain=True):    # tests: set, then restore on exit
        ...

Rules shared by every knob: an unset or empty variable means the default; surrounding whitespace is
ignored; a value that does not parse raises `UserError` naming the variable and what it expects.
Overrides (`scope`, attribute assignment) win over the environment; an override of `None` means
"use the default", whatever the environment says. Child processes (the engine worker) should be
started with `knobs.child_environ()` so that they see the same values, overrides included.

It also reads `XDG_DATA_HOME` (`knobs.data_dir`, where the board and the registry live unless told
otherwise), so that nothing is written into the working directory unasked.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from polymorph.errors import UserError

T = TypeVar("T")

ENV_PREFIX = "POLYMORPH_"


class Knob(Generic[T]):
    """One typed environment variable: its name, default, doc, and how its text parses.

    A data descriptor on `Knobs`: reading `knobs.x` returns the override if one is set, else the parsed
    environment variable, else the default. Subclasses define `kind` (shown in listings), `expects`
    (the phrase used in error messages), `parse` and `format`.
    """

    kind: ClassVar[str] = "str"
    expects: str = "a string"

    def __init__(self, env: str, default: T | None, doc: str) -> None:
        if not env.startswith(ENV_PREFIX):
            raise ValueError(f"knob variable {env!r} must start with {ENV_PREFIX}")
        self.env = env
        self._default = default
        self.doc = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Knobs | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return self.value(obj)

    def __set__(self, obj: Knobs, value: object) -> None:
        obj._overrides[self.name] = self.coerce(value)

    def __delete__(self, obj: Knobs) -> None:
        obj._overrides.pop(self.name, None)

    def value(self, obj: Knobs) -> T | None:
        """The current value: override, else environment, else default."""
        if self.name in obj._overrides:
            override = obj._overrides[self.name]
            return self.default() if override is None else override  # type: ignore[return-value]
        return self.from_environ()

    def source(self, obj: Knobs) -> str:
        """Where the current value comes from: "override", "environment" or "default"."""
        if self.name in obj._overrides:
            return "default" if obj._overrides[self.name] is None else "override"
        return "environment" if self._raw() is not None else "default"

    def from_environ(self) -> T | None:
        raw = self._raw()
        return self.default() if raw is None else self.parse(raw)

    def default(self) -> T | None:
        return self._default

    def default_text(self) -> str:
        """The default as shown to users ("none" when there is none)."""
        default = self.default()
        return "none" if default is None else self.format(default)

    def coerce(self, value: object) -> T | None:
        """An override value: None (use the default), text (parsed as the variable would be), or T."""
        if value is None:
            return None
        if isinstance(value, str):
            return self.parse(value.strip())
        return self.check(value)

    def check(self, value: object) -> T:
        """Validate an already-typed override value."""
        raise NotImplementedError

    def parse(self, raw: str) -> T:
        raise NotImplementedError

    def format(self, value: T) -> str:
        """The environment text for `value` (inverse of `parse`)."""
        return str(value)

    def bad(self, raw: str) -> UserError:
        return UserError(f"{self.env}={raw!r} is not valid: expected {self.expects}; fix or unset {self.env}")

    def _raw(self) -> str | None:
        raw = os.environ.get(self.env)
        if raw is None or not raw.strip():
            return None
        return raw.strip()


class BoolKnob(Knob[bool]):
    kind = "bool"
    expects = "1 or 0 (also true/false, yes/no, on/off)"
    _TRUE = frozenset({"1", "true", "yes", "on"})
    _FALSE = frozenset({"0", "false", "no", "off"})

    def parse(self, raw: str) -> bool:
        text = raw.lower()
        if text in self._TRUE:
            return True
        if text in self._FALSE:
            return False
        raise self.bad(raw)

    def check(self, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.bad(repr(value))
        return value

    def format(self, value: bool) -> str:
        return "1" if value else "0"


class IntKnob(Knob[int]):
    kind = "int"

    def __init__(self, env: str, default: int | None, doc: str, minimum: int | None = None) -> None:
        super().__init__(env, default, doc)
        self.minimum = minimum
        self.expects = "an integer" if minimum is None else f"an integer >= {minimum}"

    def parse(self, raw: str) -> int:
        try:
            value = int(raw, 10)
        except ValueError:
            raise self.bad(raw) from None
        if self.minimum is not None and value < self.minimum:
            raise self.bad(raw)
        return value

    def check(self, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(repr(value))
        return self.parse(str(value))


class FloatKnob(Knob[float]):
    kind = "float"

    def __init__(self, env: str, default: float | None, doc: str, positive: bool = False) -> None:
        super().__init__(env, default, doc)
        self.positive = positive
        self.expects = "a number > 0" if positive else "a number"

    def parse(self, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise self.bad(raw) from None
        if not math.isfinite(value) or (self.positive and value <= 0):
            raise self.bad(raw)
        return value

    def check(self, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.bad(repr(value))
        return self.parse(repr(float(value)))

    def format(self, value: float) -> str:
        return repr(float(value))


class StrKnob(Knob[str]):
    kind = "str"
    expects = "a non-empty string"

    def parse(self, raw: str) -> str:
        if not raw:
            raise self.bad(raw)
        return raw

    def check(self, value: object) -> str:
        if not isinstance(value, str):
            raise self.bad(repr(value))
        return self.parse(value)


class SecretKnob(StrKnob):
    """A credential: read like a string knob, never shown (listings print `set` or `unset`)."""

    kind = "secret"

    def format(self, value: str) -> str:
        return "set"


class PathKnob(Knob[Path]):
    """A filesystem path; `~` is expanded at access time. Existence is the reader's business."""

    kind = "path"
    expects = "a filesystem path"

    def __init__(self, env: str, default: str | None, doc: str) -> None:
        super().__init__(env, None, doc)
        self._default_text = default  # expanded at access time: HOME may change after import

    def parse(self, raw: str) -> Path:
        if not raw or "\x00" in raw:
            raise self.bad(raw)
        return Path(raw).expanduser()

    def check(self, value: object) -> Path:
        if not isinstance(value, (str, os.PathLike)):
            raise self.bad(repr(value))
        return self.parse(os.fspath(value))  # type: ignore[arg-type]

    def default(self) -> Path | None:
        return None if self._default_text is None else Path(self._default_text).expanduser()

    def default_text(self) -> str:
        return "none" if self._default_text is None else self._default_text


class PathListKnob(Knob[tuple[Path, ...]]):
    """Filesystem paths separated by `os.pathsep` (`:` on POSIX), in order, `~` expanded at access
    time; empty entries are skipped. Existence is the reader's business."""

    kind = "paths"
    expects = f"filesystem paths separated by {os.pathsep!r}"

    def parse(self, raw: str) -> tuple[Path, ...]:
        if "\x00" in raw:
            raise self.bad(raw)
        paths = tuple(Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip())
        if not paths:
            raise self.bad(raw)
        return paths

    def check(self, value: object) -> tuple[Path, ...]:
        if isinstance(value, (str, os.PathLike)):
            return self.parse(os.fspath(value))  # type: ignore[arg-type]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, (str, os.PathLike)) for v in value):
            raise self.bad(repr(value))
        return self.parse(os.pathsep.join(os.fspath(v) for v in value))  # type: ignore[misc]

    def default(self) -> tuple[Path, ...]:
        return ()

    def default_text(self) -> str:
        return "none"

    def format(self, value: tuple[Path, ...]) -> str:
        return os.pathsep.join(str(p) for p in value)


def data_dir() -> Path:
    """polymorph's data directory: `$XDG_DATA_HOME/polymorph`, else `~/.local/share/polymorph`.

    As the XDG base-directory spec says, an unset, empty or relative `XDG_DATA_HOME` is ignored.
    Read at call time (HOME and XDG_DATA_HOME may change after import); creating it is the writer's
    business (`polymorph.search.board.SqliteFile` makes it, mode 0700, on first use).
    """
    xdg = os.environ.get("XDG_DATA_HOME", "").strip()
    base = (
        Path(xdg)
        if xdg and "\x00" not in xdg and Path(xdg).is_absolute()
        else Path.home() / ".local" / "share"
    )
    return base / "polymorph"


class DataFileKnob(PathKnob):
    """A file path knob whose default is a file in `data_dir()` (shown with `~` for the home directory)."""

    def __init__(self, env: str, filename: str, doc: str) -> None:
        super().__init__(env, None, doc)
        self.filename = filename

    def default(self) -> Path:
        return data_dir() / self.filename

    def default_text(self) -> str:
        path, home = self.default(), Path.home()
        return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)


@dataclass(frozen=True)
class KnobInfo:
    """One row of `knobs.describe()`: for `polymorph knobs` and the README table."""

    name: str  # attribute on `knobs`, e.g. "kv_block_size"
    env: str  # e.g. "POLYMORPH_KV_BLOCK_SIZE"
    kind: str  # bool, int, float, str, path, paths
    default: str  # rendered default ("none" when there is none)
    value: Any  # current typed value
    source: str  # "default", "environment" or "override"
    doc: str


class Knobs:
    """All `POLYMORPH_*` knobs. Use the module's `knobs` instance; add a knob by adding a line here."""

    calibration_dir = PathKnob(
        "POLYMORPH_CALIBRATION_DIR",
        None,
        "directory of measured hardware calibration; unset: the checkout's hwprofiles/measured",
    )
    profile_dirs = PathListKnob(
        "POLYMORPH_PROFILES",
        None,
        "extra directories of hardware profiles (<id>.toml, searched after the shipped hwprofiles/); "
        "a new chip is one file there",
    )
    cache_dir = PathKnob(
        "POLYMORPH_CACHE_DIR",
        "~/.cache/polymorph",
        "cache for compiled artifacts, downloaded configs and candidate kernels",
    )
    backend = StrKnob("POLYMORPH_BACKEND", "cpu", "backend used when a command is given no --backend")
    board = DataFileKnob(
        "POLYMORPH_BOARD",
        "board.sqlite",
        "message board SQLite file of `polymorph board` (a tune's own: its --board, else OUT/board.sqlite); "
        "unset: board.sqlite in $XDG_DATA_HOME/polymorph (~/.local/share/polymorph)",
    )
    registry = DataFileKnob(
        "POLYMORPH_REGISTRY",
        "registry.sqlite",
        "champion registry SQLite file; unset: registry.sqlite in $XDG_DATA_HOME/polymorph "
        "(~/.local/share/polymorph)",
    )
    agent_api_key = SecretKnob(
        "POLYMORPH_AGENT_API_KEY", None, "bearer key for `tune --agent-endpoint` (an OpenAI-compatible API)"
    )
    engine = StrKnob(
        "POLYMORPH_ENGINE",
        None,
        "address of a running engine to use instead of starting one; unset: start one",
    )
    seed = IntKnob("POLYMORPH_SEED", 0, "seed of random weights", minimum=0)
    kv_block_size = IntKnob("POLYMORPH_KV_BLOCK_SIZE", 16, "tokens per paged KV-cache block", minimum=1)
    memory_limit_gb = FloatKnob(
        "POLYMORPH_MEMORY_LIMIT_GB",
        None,
        "machine memory (GB) assumed by the 'model too large' check; unset: the machine's own",
        positive=True,
    )
    cpu_threads = IntKnob(
        "POLYMORPH_CPU_THREADS",
        None,
        "torch threads of the cpu backend; unset: 1 for small models, else all cores",
        minimum=1,
    )
    sandbox = BoolKnob(
        "POLYMORPH_SANDBOX",
        True,
        "start engine workers in the sandbox (namespaces, Landlock, seccomp); off only to debug a worker",
    )
    plain = BoolKnob("POLYMORPH_PLAIN", False, "force plain CLI output (no colours, tables or live progress)")

    def __init__(self) -> None:
        self._overrides: dict[str, object] = {}

    @property
    def data_dir(self) -> Path:
        """polymorph's data directory (from XDG_DATA_HOME, not a POLYMORPH_* variable): see `data_dir()`."""
        return data_dir()

    @classmethod
    def all(cls) -> list[Knob[Any]]:
        """Every knob descriptor, in declaration order."""
        return [v for v in vars(cls).values() if isinstance(v, Knob)]

    def knob(self, name: str) -> Knob[Any]:
        """The descriptor for attribute `name`; TypeError listing the known names if there is none."""
        found = vars(type(self)).get(name)
        if not isinstance(found, Knob):
            known = ", ".join(k.name for k in self.all())
            raise TypeError(f"unknown knob {name!r}; known knobs: {known}")
        return found

    @contextmanager
    def scope(self, **overrides: object) -> Iterator[Knobs]:
        """Set knobs by attribute name for the duration of a `with` block, then restore them.

        Values are typed values, text (parsed as the environment variable would be) or None (the
        default, whatever the environment says). Bad values raise before anything is changed. On exit
        the previous overrides and every `POLYMORPH_*` environment variable are restored, so a test
        that also edits `os.environ` inside the block leaves nothing behind. Scopes nest.
        """
        coerced = {name: self.knob(name).coerce(value) for name, value in overrides.items()}
        saved_overrides = dict(self._overrides)
        saved_env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
        self._overrides.update(coerced)
        try:
            yield self
        finally:
            self._overrides.clear()
            self._overrides.update(saved_overrides)
            for key in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
                if key not in saved_env:
                    del os.environ[key]
            os.environ.update(saved_env)

    def describe(self) -> list[KnobInfo]:
        """Every knob with its doc, default and current value. Raises UserError on a bad variable."""
        rows = []
        for knob in self.all():
            rows.append(
                KnobInfo(
                    name=knob.name,
                    env=knob.env,
                    kind=knob.kind,
                    default=knob.default_text(),
                    value=("set" if knob.value(self) else "unset")
                    if isinstance(knob, SecretKnob)
                    else knob.value(self),
                    source=knob.source(self),
                    doc=knob.doc,
                )
            )
        return rows

    def child_environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for a child process: `base` (default os.environ) with overrides applied.

        An override of None removes the variable, so the child sees the default too.
        """
        env = dict(os.environ if base is None else base)
        for name, override in self._overrides.items():
            knob = self.knob(name)
            if override is None:
                env.pop(knob.env, None)
            else:
                env[knob.env] = knob.format(override)
        return env


knobs = Knobs()
