"""polymorph.knobs: typed POLYMORPH_* variables, read at access time, scoped overrides for tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from polymorph.errors import UserError
from polymorph.knobs import Knobs, knobs

ALL_ENV = [k.env for k in Knobs.all()]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ALL_ENV:
        monkeypatch.delenv(env, raising=False)


def test_defaults() -> None:
    assert knobs.calibration_dir is None
    assert knobs.cache_dir == Path.home() / ".cache" / "polymorph"
    assert knobs.backend == "cpu"
    assert knobs.engine is None
    assert knobs.seed == 0
    assert knobs.kv_block_size == 16
    assert knobs.memory_limit_gb is None
    assert knobs.plain is False


def test_board_and_registry_live_in_the_data_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Unset: files in $XDG_DATA_HOME/polymorph, else ~/.local/share/polymorph (an empty or relative
    XDG_DATA_HOME is ignored, as the XDG spec says), read at access time; the variables still win."""
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    share = home / ".local" / "share" / "polymorph"
    assert (knobs.data_dir, knobs.board, knobs.registry) == (
        share,
        share / "board.sqlite",
        share / "registry.sqlite",
    )
    rows = {r.env: r for r in knobs.describe()}
    assert rows["POLYMORPH_REGISTRY"].default == "~/.local/share/polymorph/registry.sqlite"
    assert rows["POLYMORPH_BOARD"].default == "~/.local/share/polymorph/board.sqlite"
    for ignored in ("", "  ", "relative/share"):
        monkeypatch.setenv("XDG_DATA_HOME", ignored)
        assert knobs.registry == share / "registry.sqlite"
    monkeypatch.setenv("XDG_DATA_HOME", str(xdg))
    assert (knobs.data_dir, knobs.board, knobs.registry) == (
        xdg / "polymorph",
        xdg / "polymorph" / "board.sqlite",
        xdg / "polymorph" / "registry.sqlite",
    )
    assert {r.env: r for r in knobs.describe()}["POLYMORPH_REGISTRY"].default == str(
        xdg / "polymorph" / "registry.sqlite"
    )
    monkeypatch.setenv("POLYMORPH_REGISTRY", "~/mine.sqlite")
    monkeypatch.setenv("POLYMORPH_BOARD", str(tmp_path / "b.sqlite"))
    assert (knobs.registry, knobs.board) == (home / "mine.sqlite", tmp_path / "b.sqlite")
    with knobs.scope(registry=None):
        assert knobs.registry == xdg / "polymorph" / "registry.sqlite"
        assert "POLYMORPH_REGISTRY" not in knobs.child_environ()


def test_every_requested_variable_is_a_knob() -> None:
    assert set(ALL_ENV) == {
        "POLYMORPH_CALIBRATION_DIR",
        "POLYMORPH_CACHE_DIR",
        "POLYMORPH_BACKEND",
        "POLYMORPH_BOARD",
        "POLYMORPH_REGISTRY",
        "POLYMORPH_AGENT_API_KEY",
        "POLYMORPH_ENGINE",
        "POLYMORPH_SEED",
        "POLYMORPH_KV_BLOCK_SIZE",
        "POLYMORPH_MEMORY_LIMIT_GB",
        "POLYMORPH_CPU_THREADS",
        "POLYMORPH_PLAIN",
        "POLYMORPH_SANDBOX",
        "POLYMORPH_PROFILES",
    }


def test_read_at_access_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POLYMORPH_SEED", "7")
    monkeypatch.setenv("POLYMORPH_KV_BLOCK_SIZE", " 32 ")
    monkeypatch.setenv("POLYMORPH_MEMORY_LIMIT_GB", "1.5")
    monkeypatch.setenv("POLYMORPH_PLAIN", "yes")
    monkeypatch.setenv("POLYMORPH_CALIBRATION_DIR", str(tmp_path))
    monkeypatch.setenv("POLYMORPH_ENGINE", "tcp://127.0.0.1:5555")
    assert knobs.seed == 7
    assert knobs.kv_block_size == 32
    assert knobs.memory_limit_gb == 1.5
    assert knobs.plain is True
    assert knobs.calibration_dir == tmp_path
    assert knobs.engine == "tcp://127.0.0.1:5555"
    monkeypatch.setenv("POLYMORPH_SEED", "8")
    assert knobs.seed == 8


def test_empty_means_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYMORPH_SEED", "")
    monkeypatch.setenv("POLYMORPH_BACKEND", "  ")
    assert knobs.seed == 0
    assert knobs.backend == "cpu"


def test_path_expands_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert knobs.cache_dir == tmp_path / ".cache" / "polymorph"
    monkeypatch.setenv("POLYMORPH_CACHE_DIR", "~/elsewhere")
    assert knobs.cache_dir == tmp_path / "elsewhere"


@pytest.mark.parametrize("value", ["0", "false", "No", "OFF"])
def test_bool_false_spellings(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("POLYMORPH_PLAIN", value)
    assert knobs.plain is False


@pytest.mark.parametrize(
    ("env", "value", "expects"),
    [
        ("POLYMORPH_SEED", "abc", "integer"),
        ("POLYMORPH_SEED", "-1", "integer >= 0"),
        ("POLYMORPH_SEED", "1.5", "integer"),
        ("POLYMORPH_KV_BLOCK_SIZE", "0", "integer >= 1"),
        ("POLYMORPH_MEMORY_LIMIT_GB", "lots", "number > 0"),
        ("POLYMORPH_MEMORY_LIMIT_GB", "-4", "number > 0"),
        ("POLYMORPH_MEMORY_LIMIT_GB", "nan", "number > 0"),
        ("POLYMORPH_PLAIN", "maybe", "1 or 0"),
    ],
)
def test_bad_value_names_variable(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, expects: str
) -> None:
    monkeypatch.setenv(env, value)
    name = next(k.name for k in Knobs.all() if k.env == env)
    with pytest.raises(UserError) as err:
        getattr(knobs, name)
    message = str(err.value)
    assert env in message
    assert repr(value) in message
    assert expects in message
    assert "\n" not in message


def test_scope_sets_and_restores(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POLYMORPH_SEED", "5")
    with knobs.scope(seed=3, plain=True, kv_block_size="64", cache_dir=tmp_path, backend="cuda") as k:
        assert k is knobs
        assert knobs.seed == 3
        assert knobs.plain is True
        assert knobs.kv_block_size == 64
        assert knobs.cache_dir == tmp_path
        assert knobs.backend == "cuda"
    assert knobs.seed == 5
    assert knobs.plain is False
    assert knobs.kv_block_size == 16
    assert knobs.backend == "cpu"


def test_scope_none_forces_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYMORPH_KV_BLOCK_SIZE", "128")
    with knobs.scope(kv_block_size=None):
        assert knobs.kv_block_size == 16
        assert {r.name: r.source for r in knobs.describe()}["kv_block_size"] == "default"
        assert "POLYMORPH_KV_BLOCK_SIZE" not in knobs.child_environ()
    assert knobs.kv_block_size == 128


def test_scopes_nest_and_restore_on_error() -> None:
    with pytest.raises(RuntimeError), knobs.scope(seed=1):
        with knobs.scope(seed=2, plain=True):
            assert (knobs.seed, knobs.plain) == (2, True)
        assert (knobs.seed, knobs.plain) == (1, False)
        raise RuntimeError("boom")
    assert knobs.seed == 0


def test_scope_restores_environment_edits() -> None:
    import os

    os.environ["POLYMORPH_PLAIN"] = "1"
    try:
        with knobs.scope():
            os.environ["POLYMORPH_SEED"] = "9"
            del os.environ["POLYMORPH_PLAIN"]
            assert knobs.seed == 9
        assert "POLYMORPH_SEED" not in os.environ
        assert os.environ["POLYMORPH_PLAIN"] == "1"
    finally:
        os.environ.pop("POLYMORPH_PLAIN", None)


def test_scope_rejects_bad_values_before_changing_anything() -> None:
    with pytest.raises(UserError, match="POLYMORPH_SEED"), knobs.scope(plain=True, seed="abc"):
        pass
    with pytest.raises(UserError, match="POLYMORPH_PLAIN"), knobs.scope(plain=3):
        pass
    with pytest.raises(TypeError, match="known knobs"), knobs.scope(sede=1):
        pass
    assert knobs.plain is False
    assert knobs.seed == 0


def test_attribute_assignment_overrides_until_deleted() -> None:
    try:
        knobs.seed = 4
        assert knobs.seed == 4
        with pytest.raises(UserError, match="POLYMORPH_SEED"):
            knobs.seed = -2
    finally:
        del knobs.seed
    assert knobs.seed == 0


def test_describe_lists_every_knob() -> None:
    with knobs.scope(seed=11):
        rows = {r.env: r for r in knobs.describe()}
    assert set(rows) == set(ALL_ENV)
    assert all(r.doc for r in rows.values())
    assert rows["POLYMORPH_SEED"].value == 11
    assert rows["POLYMORPH_SEED"].source == "override"
    assert rows["POLYMORPH_SEED"].default == "0"
    assert rows["POLYMORPH_CACHE_DIR"].default == "~/.cache/polymorph"
    assert rows["POLYMORPH_ENGINE"].default == "none"
    assert rows["POLYMORPH_PLAIN"].kind == "bool"


def test_child_environ_carries_overrides() -> None:
    base = {"PATH": "/bin", "POLYMORPH_ENGINE": "tcp://x:1"}
    with knobs.scope(seed=6, plain=True, memory_limit_gb=2, engine=None):
        env = knobs.child_environ(base)
    assert env == {
        "PATH": "/bin",
        "POLYMORPH_SEED": "6",
        "POLYMORPH_PLAIN": "1",
        "POLYMORPH_MEMORY_LIMIT_GB": "2.0",
    }
    assert base == {"PATH": "/bin", "POLYMORPH_ENGINE": "tcp://x:1"}


def test_path_list_splits_on_pathsep_and_expands_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import os

    assert knobs.profile_dirs == ()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("POLYMORPH_PROFILES", f"~/a{os.pathsep}{os.pathsep}/b/c")
    assert knobs.profile_dirs == (tmp_path / "a", Path("/b/c"))
    with knobs.scope(profile_dirs=[tmp_path / "x", "y"]):
        assert knobs.profile_dirs == (tmp_path / "x", Path("y"))
        assert knobs.child_environ({})["POLYMORPH_PROFILES"] == f"{tmp_path / 'x'}{os.pathsep}y"
    monkeypatch.setenv("POLYMORPH_PROFILES", os.pathsep)
    with pytest.raises(UserError, match="POLYMORPH_PROFILES"):
        _ = knobs.profile_dirs
