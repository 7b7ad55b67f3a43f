"""Faults of the data a user points the CLI at, each refused in one line with exit 2 before anything is
written or started: `compile`/`tune --out` into a folder of someone else's files, `registry export`
or `import` onto the registry's own file, `engine start` with sizes no machine holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from polymorph.cli import main
from polymorph.cli.outdir import MANIFEST
from polymorph.search.registry import Champion, ChampionKey, Measurement, Registry
from polymorph.verify.tolerance import Tolerance


def one_line_error(capsys: pytest.CaptureFixture[str], code: int, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("polymorph: error:") and "\n" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


# --- compile --out, tune --out ------------------------------------------------------------------------


def test_compile_never_overwrites_a_users_folder_unasked(tmp_path: Path, capsys) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "plan.json").write_text("my own notes\n")
    code = main(["compile", "llama-tiny", "--out", str(mine)])
    one_line_error(capsys, code, str(mine), "not empty", "--force")
    assert (mine / "plan.json").read_text() == "my own notes\n" and sorted(mine.iterdir()) == [
        mine / "plan.json"
    ]

    assert main(["compile", "llama-tiny", "--out", str(mine), "--force"]) == 0  # asked: it writes
    assert (mine / "plan.json").read_text() != "my own notes\n" and (mine / MANIFEST).is_file()


def test_compile_into_a_new_empty_or_its_own_folder(tmp_path: Path, capsys) -> None:
    new, empty = tmp_path / "a" / "new", tmp_path / "empty"
    empty.mkdir()
    for out in (new, empty, new):  # the last: a previous compile output, written again
        assert main(["compile", "llama-tiny", "--out", str(out)]) == 0, capsys.readouterr().err
        assert (out / "plan.json").is_file() and (out / MANIFEST).is_file()


def test_a_tune_output_and_a_compile_output_are_not_each_others(tmp_path: Path, capsys) -> None:
    compiled = tmp_path / "compiled"
    assert main(["compile", "llama-tiny", "--out", str(compiled)]) == 0
    capsys.readouterr()
    code = main(["tune", "llama-tiny", "--budget", "30s", "--out", str(compiled)])
    one_line_error(capsys, code, "`polymorph compile` output", "--force")

    tuned = tmp_path / "tuned"
    tuned.mkdir()
    (tuned / MANIFEST).write_text('{"format": "polymorph-output", "command": "tune"}')
    (tuned / "tune-report.json").write_text("{}")
    code = main(["compile", "llama-tiny", "--out", str(tuned)])
    one_line_error(capsys, code, "`polymorph tune` output")


def test_tune_refuses_a_users_folder_before_it_starts(tmp_path: Path, capsys) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    code = main(["tune", "llama-tiny", "--budget", "30s", "--out", str(mine)])
    one_line_error(capsys, code, str(mine), "not empty", "--force")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]  # no board, registry or logs written


# --- registry export / import onto itself -------------------------------------------------------------


def _registry(path: Path) -> None:
    key = ChampionKey("rmsnorm(f32[batch,seq,64],f32[64])->(f32[batch,seq,64])", "b1-ctx512-1024", "cpu", "t")
    reg = Registry(path)
    reg.offer(Champion(key=key, source="IMPLEMENTS = 'rmsnorm'\n", config={}, reasoning="",
                       measurement=Measurement(1e-5, 0.0, 3), gates=("numerics",), tolerance=Tolerance(0, 0)))  # fmt: skip
    reg.close()


def test_registry_export_onto_its_own_file_is_refused(tmp_path: Path, capsys) -> None:
    reg = tmp_path / "registry.sqlite"
    _registry(reg)
    before = reg.read_bytes()
    for target in (reg, tmp_path / "." / "registry.sqlite"):
        code = main(["registry", "export", str(target), "--registry", str(reg)])
        one_line_error(capsys, code, "registry's own SQLite file")
    (tmp_path / "link.sqlite").symlink_to(reg)
    code = main(["registry", "export", str(tmp_path / "link.sqlite"), "--registry", str(reg)])
    one_line_error(capsys, code, "registry's own SQLite file")
    assert reg.read_bytes() == before and len(Registry(reg).list()) == 1

    board = tmp_path / "board.sqlite"  # another SQLite store is not a bundle either
    from polymorph.search.board import Board

    Board(board).close()
    code = main(["registry", "export", str(board), "--registry", str(reg)])
    one_line_error(capsys, code, "is a SQLite file")


def test_registry_import_of_its_own_file_is_refused(tmp_path: Path, capsys) -> None:
    reg = tmp_path / "registry.sqlite"
    _registry(reg)
    code = main(["registry", "import", str(reg), "--registry", str(reg)])
    one_line_error(capsys, code, "registry's own SQLite file")
    assert len(Registry(reg).list()) == 1


# --- engine start with absurd sizes -------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--batch", str(10**9)], ("batch 1000000000", "KV cache", "available", "--batch or --ctx")),
        (["--ctx", str(10**12)], ("context 1000000000000", "KV cache", "--batch or --ctx")),
        (["--batch", str(10**6), "--backend", "cuda"], ("h200", "device memory")),
        (["--block-size", "0"], ("--block-size", "at least 1")),
        (["--block-size", "-4"], ("--block-size", "got -4")),
        (["--batch", "0"], ("--batch",)),
        (["--ctx", "-1"], ("--ctx",)),
    ],
    ids=["batch", "ctx", "device", "block-0", "block-negative", "batch-0", "ctx-negative"],
)
def test_engine_start_with_absurd_sizes_says_why_before_starting(
    capsys, monkeypatch: pytest.MonkeyPatch, argv: list[str], needles: tuple[str, ...]
) -> None:
    from polymorph.engine import controller

    def no_start(*args: object, **kwargs: object) -> None:
        raise AssertionError("an engine process was started")

    monkeypatch.setattr(controller, "start_detached", no_start)
    code = main(["engine", "start", "llama-tiny", *argv])
    one_line_error(capsys, code, *needles)


def test_engine_sizes_that_fit_pass_the_check() -> None:
    from polymorph import api

    assert 0 < api.check_engine_sizes("llama-tiny", "cpu", batch=4, ctx=256, block_size=8) < 1e9
