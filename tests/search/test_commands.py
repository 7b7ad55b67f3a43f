"""`polymorph board ...` and `polymorph registry ...` through the CLI's own parser class, with real files.

polymorph/cli/command.py does not add these commands yet (the lead wires `add_commands` in); the parser here
is built the way cli.build_parser builds its own, and errors map to exit codes the way cli.main does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

from polymorph.cli import command as cli
from polymorph.errors import CheckFailed, UserError
from polymorph.knobs import knobs
from polymorph.search.board import Board
from polymorph.search.commands import add_commands
from polymorph.search.registry import Champion, ChampionKey, Measurement, Registry
from polymorph.verify.tolerance import Tolerance

KERNEL = "IMPLEMENTS = 'rmsnorm'\nCONFIGS = [{'block': 128}]\n"
GROUP = "layers.0.attn.norm"


@pytest.fixture(autouse=True)
def clean_knobs(monkeypatch: pytest.MonkeyPatch):
    """Plain output and default knobs, whatever the caller's environment sets."""
    for key in [k for k in os.environ if k.startswith("POLYMORPH_")]:
        monkeypatch.delenv(key)
    with knobs.scope(plain=True):
        yield


def parser() -> argparse.ArgumentParser:
    p = cli._Parser(prog="polymorph")
    add_commands(p.add_subparsers(dest="command", metavar="COMMAND", parser_class=cli._Parser))
    return p


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) as cli.main reports them."""
    try:
        args = parser().parse_args(list(argv))
        code = args.fn(args)
    except (UserError, CheckFailed) as e:
        prefix = "error" if isinstance(e, UserError) else "check failed"
        print(f"polymorph: {prefix}: {e}", file=sys.stderr)
        code = e.exit_code
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, expected_code: int, *needles: str) -> None:
    lines = err.splitlines()
    assert code == expected_code and len(lines) == 1 and "Traceback" not in err, (code, err)
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


@pytest.fixture
def kernel(tmp_path: Path) -> Path:
    path = tmp_path / "my_rmsnorm.py"
    path.write_text(KERNEL)
    return path


def test_defaults_are_files_in_the_data_directory(
    capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kernel: Path
) -> None:
    """Unset POLYMORPH_BOARD/REGISTRY: files in $XDG_DATA_HOME/polymorph, else ~/.local/share/polymorph
    (a relative XDG_DATA_HOME is ignored, as the XDG spec says); the variables and flags still win, and
    nothing lands in the working directory."""
    home, xdg, work = tmp_path / "home", tmp_path / "xdg", tmp_path / "work"
    for d in (home, work):
        d.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_DATA_HOME", str(xdg))
    assert parser().parse_args(["board", "show", "1"]).board == xdg / "polymorph" / "board.sqlite"
    assert parser().parse_args(["registry", "list"]).registry == xdg / "polymorph" / "registry.sqlite"
    for unset in ("", "relative/dir"):
        monkeypatch.setenv("XDG_DATA_HOME", unset)
        assert knobs.registry == home / ".local" / "share" / "polymorph" / "registry.sqlite"
    monkeypatch.setenv("XDG_DATA_HOME", str(xdg))
    monkeypatch.setenv("POLYMORPH_BOARD", str(tmp_path / "b.sqlite"))
    assert parser().parse_args(["board", "show", "1"]).board == tmp_path / "b.sqlite"
    assert parser().parse_args(["board", "show", "1", "--board", "x.sqlite"]).board == Path("x.sqlite")
    monkeypatch.delenv("POLYMORPH_BOARD")
    code, _, err = run(capsys, "registry", "list")
    one_line_error(code, err, 2, f"no registry at {xdg / 'polymorph' / 'registry.sqlite'}")
    # The data directory is made on first use, private to the user, and holds the board.
    code, out, err = run(capsys, "board", "post", GROUP, "--kernel", str(kernel), "--target", "cpu")
    assert code == 0, err
    assert Board(xdg / "polymorph" / "board.sqlite").show(int(out.split()[0])).group == GROUP
    assert (xdg / "polymorph").stat().st_mode & 0o777 == 0o700
    assert list(work.iterdir()) == [] and list(home.iterdir()) == []
    # A directory the user named is not made for them: one line.
    elsewhere = tmp_path / "nowhere" / "b.sqlite"
    code, _, err = run(capsys, "board", "post", GROUP, "--kernel", str(kernel), "--target", "cpu", "--board",
                       str(elsewhere))  # fmt: skip
    one_line_error(code, err, 2, f"directory {elsewhere.parent} does not exist")


def test_post_show_wait_results(capsys, tmp_path: Path, kernel: Path) -> None:
    db = str(tmp_path / "board.sqlite")
    post = ["board", "post", GROUP, "--kernel", str(kernel), "--target", "cpu", "--board", db]
    code, out, err = run(capsys, *post, "--config", '{"block": 256}', "--agent", "me", "--reasoning", "why")
    assert code == 0 and err == ""
    cid = int(out.splitlines()[0])
    assert f"candidate {cid} (kernel" in out and ": open" in out
    code, out, _ = run(capsys, *post, "--config", '{"block":256}')  # a duplicate: the same id
    assert code == 0 and int(out.splitlines()[0]) == cid

    board = Board(db)
    c = board.show(cid)
    assert (c.backend, c.target, c.config, c.agent, c.reasoning, c.source) == (
        "cpu", "cpu", {"block": 256}, "me", "why", KERNEL,
    )  # fmt: skip
    code, out, err = run(capsys, "board", "wait", str(cid), "--timeout", "0", "--board", db)
    one_line_error(code, err, 1, f"candidate {cid} has no result after 0 s (open)")

    board.claim("w1", 30)
    board.post_result(cid, "w1", True, "", {"median_s": 2.5e-5, "spread_s": 1e-7}, {"numerics": "ok"})
    code, out, _ = run(capsys, "board", "wait", str(cid), "--board", db)
    assert code == 0 and f"candidate {cid}: ok, median 25 us" in out and "numerics: ok" in out
    code, out, _ = run(capsys, "board", "show", str(cid), "--source", "--board", db)
    assert code == 0 and "done: ok" in out and "reasoning: why" in out and KERNEL.strip() in out
    code, out, _ = run(capsys, "board", "results", "--board", db)
    rows = [line.split("\t") for line in out.splitlines()[2:]]
    assert rows == [[str(cid), GROUP, "ok", "25 us", "0.1 us", "w1", "-"]]


def test_a_failed_candidate_is_exit_1(capsys, tmp_path: Path) -> None:
    db = str(tmp_path / "board.sqlite")
    code, out, _ = run(
        capsys, "board", "post", GROUP, "--config", '{"block": 64}', "--target", "cpu", "--board", db
    )
    cid = int(out.splitlines()[0])
    board = Board(db)
    board.claim("w1", 30)
    board.post_result(cid, "w1", False, "kv isolation: guard block written", {}, {"kv-isolation": "failed"})
    code, out, err = run(capsys, "board", "wait", str(cid), "--board", db)
    one_line_error(code, err, 1, f"candidate {cid} failed: kv isolation: guard block written")
    assert "failed" in out
    code, out, _ = run(capsys, "board", "results", "--failed", "--board", db)
    assert "kv isolation" in out
    code, out, _ = run(capsys, "board", "results", "--ok", "--board", db)
    assert len(out.splitlines()) == 2  # title and header only


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["board", "show", "7"], ("no candidate 7",)),
        (
            ["board", "post", GROUP, "--config", "{block: 1}", "--target", "cpu"],
            ("--config must be a JSON object",),
        ),
        (["board", "post", GROUP, "--config", "[1]", "--target", "cpu"], ("--config must be a JSON object",)),
        (["board", "post", GROUP, "--kernel", "nope.py", "--target", "cpu"], ("nope.py", "cannot read")),
        (["board", "post", GROUP, "--config", "{}", "--target", "h9000"], ("unknown chip `h9000`",)),
        (["board", "post", GROUP, "--config", "{}"], ("--target",)),
        (["board", "show", "one"], ("invalid int value",)),
        (["board", "fly"], ("invalid choice",)),
    ],
)
def test_bad_board_input_is_one_line_exit_2(capsys, tmp_path: Path, argv: list[str], needles: tuple) -> None:
    db = tmp_path / "board.sqlite"
    Board(db).post(group=GROUP, backend="cpu", target="cpu", config={"block": 1})
    code, _, err = run(capsys, *argv, *(["--board", str(db)] if argv[1] in ("show", "post") else []))
    one_line_error(code, err, 2, *needles)


def test_reading_a_missing_store_is_one_line_and_creates_nothing(capsys, tmp_path: Path) -> None:
    for argv in (
        ["board", "show", "1", "--board"],
        ["board", "results", "--board"],
        ["registry", "list", "--registry"],
    ):
        path = tmp_path / "typo.sqlite"
        code, _, err = run(capsys, *argv, str(path))
        one_line_error(code, err, 2, f"no {argv[0]} at {path}")
        assert not path.exists()


def champion(median_s: float, bucket: str = "b1-ctx512-1024") -> Champion:
    return Champion(
        key=ChampionKey(
            "rmsnorm(f32[batch,seq,64],f32[64])->(f32[batch,seq,64])", bucket, "cpu", "torch 2.11"
        ),
        source=KERNEL + f"# {median_s}\n",
        config={"block": 128},
        measurement=Measurement(median_s, median_s / 100, 20),
        gates=("numerics",),
        tolerance=Tolerance(1e-4, 1e-5),
        reasoning="rows in registers",
        agent="rmsnorm-agent",
        kernel="my_rmsnorm.py",
    )


def test_registry_list_show_export_import(capsys, tmp_path: Path) -> None:
    a, b = str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite")
    Registry(a).offer(champion(1e-5))
    Registry(a).offer(champion(4e-5, bucket="b8-ctx512-1024"))
    Registry(b).offer(champion(2e-5))
    code, out, _ = run(capsys, "registry", "list", "--registry", a)
    rows = [line.split("\t") for line in out.splitlines()[2:]]
    assert code == 0 and [r[2] for r in rows] == ["b1-ctx512-1024", "b8-ctx512-1024"]
    assert rows[0][5] == "10 us" and rows[0][0] == champion(1e-5).key.id
    code, out, _ = run(capsys, "registry", "list", "--op", "linear", "--registry", a)
    assert len(out.splitlines()) == 2

    code, out, _ = run(capsys, "registry", "show", rows[0][0][:6], "--source", "--registry", a)
    assert code == 0 and "reasoning: rows in registers" in out and "# 1e-05" in out and "numerics" in out

    bundle = str(tmp_path / "a.json")
    code, out, _ = run(capsys, "registry", "export", bundle, "--registry", a)
    assert code == 0 and "wrote 2 champions" in out
    code, out, _ = run(capsys, "registry", "import", bundle, "--registry", b)
    assert code == 0 and "1 new, 1 faster than the registry's, 0 kept" in out
    assert Registry(b).list() == Registry(a).list()


def test_bad_registry_input_is_one_line_exit_2(capsys, tmp_path: Path) -> None:
    reg = str(tmp_path / "r.sqlite")
    Registry(reg).offer(champion(1e-5))
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"format": "polymorph-registry-bundle", "schema_version": 99, "sources": {}}')
    code, _, err = run(capsys, "registry", "import", str(corrupt), "--registry", reg)
    one_line_error(code, err, 2, "schema_version 99")
    corrupt.write_text(json.dumps({"not": "a bundle"}))
    code, _, err = run(capsys, "registry", "import", str(corrupt), "--registry", reg)
    one_line_error(code, err, 2, "not a polymorph registry bundle")
    code, _, err = run(capsys, "registry", "show", "0123456789ab", "--registry", reg)
    one_line_error(code, err, 2, "no champion with key id 0123456789ab")
    code, _, err = run(capsys, "registry", "export", str(tmp_path / "no" / "dir.json"), "--registry", reg)
    one_line_error(code, err, 2, "cannot write the bundle")
