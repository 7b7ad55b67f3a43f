"""Faults of the data a user points the CLI at, each refused in one line with exit 2 before anything is
written or started: `compile`/`tune --out` into a folder of someone else's files, `registry export`
or `import` onto the registry's own file, `engine start` with sizes no machine holds, engine addresses
that are malformed or where no engine answers (loopback only), a MODEL file that does not exist, and
JSON nested too deeply to parse."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
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


# --- engine addresses ---------------------------------------------------------------------------------

ENGINE_COMMANDS = [
    ["engine", "status"],
    ["engine", "stop"],
    ["engine", "measure"],
    ["engine", "swap", "g", "k.py"],
]


@pytest.mark.parametrize(
    "address, needle",
    [
        ("tcp:", "must be followed by //"),
        ("tcp://", "no HOST:PORT after tcp://"),
        ("unix://", "no socket path"),
        ("127.0.0.1:", "no port after the host"),
        (":9", "no host before the port"),
        ("host:notaport", "port 'notaport' is not a number"),
        ("127.0.0.1:99999", "port 99999 is out of range"),
        ("127.0.0.1:0", "port 0 is out of range"),
        ("127.0.0.1", "no port"),
        ("::1:9", "in brackets"),
        ("[]:9", "no host between the brackets"),
        ("http://127.0.0.1:9", "unknown scheme 'http://'"),
        ("127.0.\x1b0.1:9", "control character"),
    ],
)
@pytest.mark.parametrize("command", ENGINE_COMMANDS, ids=lambda c: c[1])
def test_a_malformed_engine_address_is_one_line(
    capsys, address: str, needle: str, command: list[str]
) -> None:
    code = main([*command, "--engine", address])
    one_line_error(capsys, code, f"--engine {address!r}", needle, "HOST:PORT", "unix:///PATH")


def test_a_malformed_engine_address_from_the_environment_names_the_variable(
    capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYMORPH_ENGINE", "127.0.0.1:")
    one_line_error(capsys, main(["engine", "status"]), "POLYMORPH_ENGINE '127.0.0.1:'", "no port")
    monkeypatch.delenv("POLYMORPH_ENGINE")
    one_line_error(capsys, main(["engine", "status"]), "no engine given", "--engine ADDR")


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port bound but not listening: a connect there is refused, every time."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.mark.parametrize("form", ["{}", "tcp://{}", "localhost:{port}"])
@pytest.mark.parametrize("command", ENGINE_COMMANDS, ids=lambda c: c[1])
def test_nothing_listening_at_a_tcp_address_is_one_line(
    capsys, refused_port: int, form: str, command
) -> None:
    address = form.format(f"127.0.0.1:{refused_port}", port=refused_port)
    code = main([*command, "--engine", address])
    one_line_error(capsys, code, f"cannot connect to the engine at {address}", "refused", "engine start")


def test_no_engine_at_a_unix_address_is_one_line(capsys, tmp_path: Path) -> None:
    missing, plain = tmp_path / "none.sock", tmp_path / "notes.txt"
    plain.write_text("not a socket\n")
    for address, needle in ((f"unix://{missing}", "No such file"), (str(missing), "No such file"),
                            (f"unix://{plain}", "refused")):  # fmt: skip
        code = main(["engine", "status", "--engine", address])
        one_line_error(capsys, code, f"cannot connect to the engine at {address}", needle)
    assert plain.read_text() == "not a socket\n"


def _listener(reply: bytes | None) -> tuple[socket.socket, threading.Thread]:
    """A loopback server that is not an engine: it sends `reply` (None: nothing) and holds on."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed by the test
                for c in held:
                    c.close()
                return
            held.append(conn)
            if reply is not None:
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


@pytest.mark.parametrize(
    "reply, needle",
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", "not a JSON line"),
        (b'{"id": 1}\n', "is not an engine's"),
        (None, "no answer within 2 s"),
    ],
    ids=["ssh-banner", "other-json", "silent"],
)
def test_something_else_at_the_address_is_one_line(capsys, reply: bytes | None, needle: str) -> None:
    server, thread = _listener(reply)
    address = f"127.0.0.1:{server.getsockname()[1]}"
    try:
        code = main(["engine", "status", "--engine", address, "--budget", "2"])
    finally:
        server.close()
        thread.join(timeout=30)
    one_line_error(capsys, code, f"{address} is not a polymorph engine", needle)


def test_engine_swap_at_host_port_is_one_line_from_the_shell(tmp_path: Path, refused_port: int) -> None:
    """The reported case, as a user runs it: `engine swap ... --engine 127.0.0.1:PORT` with nothing there
    was a ValueError traceback and exit 1; HOST:PORT is TCP now, and the refusal one line, exit 2."""
    kernel = tmp_path / "k.py"
    kernel.write_text("IMPLEMENTS = 'rmsnorm'\n")
    done = subprocess.run(
        [sys.executable, "-m", "polymorph", "engine", "swap", "layers.0.attn.norm", str(kernel), "--engine",
         f"127.0.0.1:{refused_port}"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "Connection refused" in done.stderr, done.stderr


def test_engine_start_refuses_a_unix_path_it_cannot_listen_on(
    capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from polymorph.engine import host

    def no_start(*args: object, **kwargs: object) -> None:
        raise AssertionError("an engine process was started")

    monkeypatch.setattr(host.subprocess, "Popen", no_start)
    plain = tmp_path / "notes.txt"
    plain.write_text("keep me\n")
    long = tmp_path / ("x" * 120)
    long.mkdir()
    cases = [
        (str(plain), "not a socket"),
        (str(tmp_path / "no" / "dir" / "e.sock"), "does not exist"),
        (str(long / "e.sock"), "at most 107 bytes"),
    ]
    for path, needle in cases:
        one_line_error(capsys, main(["engine", "start", "llama-tiny", "--unix", path]), "--unix", needle)
    assert plain.read_text() == "keep me\n"  # the host used to unlink whatever was at the path
    live = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(live))
        s.listen(1)
        one_line_error(
            capsys, main(["engine", "start", "llama-tiny", "--unix", str(live)]), "already listens"
        )


# --- a missing MODEL file, a JSON nested too deeply ----------------------------------------------------


@pytest.mark.parametrize("model", ["./missing.json", "missing.json", "models/missing", "~/missing-model"])
@pytest.mark.parametrize("command", ["compile", "graph", "verify"])
def test_a_missing_model_file_is_said_to_not_exist(
    capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: str, command: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    code = main([command, model])
    err = one_line_error(capsys, code, f"no such file or directory: {model}")
    assert "unknown model" not in err and "zoo models" not in err


def test_a_zoo_name_typo_keeps_the_zoo_list(capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    one_line_error(capsys, main(["compile", "llama-tni"]), "unknown model `llama-tni`", "llama-tiny")
    (tmp_path / "notes.txt").write_text("hello\n")
    one_line_error(capsys, main(["compile", "notes.txt"]), "notes.txt", "not an IR .json graph")


DEPTH = 100_000


@pytest.fixture
def deep(tmp_path: Path) -> Path:
    """`[[[[...]]]]` DEPTH deep: JSON (and TOML) that parses only by recursing past Python's limit."""
    text = "[" * DEPTH + "]" * DEPTH
    (tmp_path / "deep.json").write_text(text)
    (tmp_path / "deep.toml").write_text(f"name = {text}\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(text)
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "plan.json").write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["registry", "import", "{d}/deep.json", "--registry", "{d}/r.sqlite"], "nested too deeply"),
        (["compile", "{d}/deep.json"], "nested too deeply"),
        (["compile", "{d}/model"], "nested too deeply"),
        (["compile", "llama-tiny", "--traffic", "{d}/deep.toml", "--out", "{d}/out"], "nested too deeply"),
        (["run", "{d}/plan"], "nested too deeply"),
        (
            ["board", "post", "g", "--target", "cpu", "--config", "DEEP", "--board", "{d}/b.sqlite"],
            "too deeply",
        ),
        (["engine", "swap", "g", "k.py", "--config", "DEEP", "--engine", "127.0.0.1:9"], "too deeply"),
    ],
    ids=["registry-import", "ir-json", "model-config", "traffic", "plan", "board-config", "swap-config"],
)
def test_json_nested_too_deeply_is_one_line(capsys, deep: Path, argv: list[str], needle: str) -> None:
    text = "[" * DEPTH + "]" * DEPTH
    args = [text if a == "DEEP" else a.format(d=deep) for a in argv]
    one_line_error(capsys, main(args), needle)
    assert not (deep / "r.sqlite").exists() or not Registry(deep / "r.sqlite").list()
