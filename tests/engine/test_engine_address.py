"""Every form of an engine address reaches the same detached engine: what `engine start` prints
(`tcp://127.0.0.1:PORT`, `unix:///PATH`), and what a user types (`127.0.0.1:PORT`, `localhost:PORT`, a
bare socket path). Loopback only. The malformed and unreachable ones: tests/unit/test_cli_faults.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from polymorph.cli import main
from polymorph.engine.controller import start_detached
from polymorph.engine.protocol import parse_address


def test_address_forms_parse() -> None:
    assert parse_address("tcp://127.0.0.1:5000") == ("tcp", ("127.0.0.1", 5000))
    assert parse_address("127.0.0.1:5000") == ("tcp", ("127.0.0.1", 5000))
    assert parse_address(" localhost:65535 ") == ("tcp", ("localhost", 65535))
    assert parse_address("[::1]:7") == ("tcp", ("::1", 7))
    assert parse_address("tcp://[::1]:7") == ("tcp", ("::1", 7))
    assert parse_address("unix:///tmp/e.sock") == ("unix", "/tmp/e.sock")
    assert parse_address("/tmp/e.sock") == ("unix", "/tmp/e.sock")
    assert parse_address("./e.sock") == ("unix", "e.sock")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("where", ["tcp", "unix"])
def test_every_address_form_reaches_the_engine(capsys, tmp_path: Path, monkeypatch, where: str) -> None:
    monkeypatch.chdir(tmp_path)
    unix = Path("engine.sock") if where == "unix" else None  # relative: the address printed is absolute
    address, pid = start_detached("llama-tiny", "cpu", unix=unix, log=tmp_path / "host.log")
    try:
        if where == "tcp":
            port = int(address.rpartition(":")[2])
            assert address == f"tcp://127.0.0.1:{port}"
            forms = [address, f"127.0.0.1:{port}", f"localhost:{port}"]
        else:
            assert address == f"unix://{tmp_path / 'engine.sock'}"
            forms = [address, str(tmp_path / "engine.sock"), "./engine.sock"]
        for form in forms:
            assert main(["engine", "status", "--engine", form]) == 0, capsys.readouterr().err
            assert ": llama-tiny on cpu (cpu)" in capsys.readouterr().out
        monkeypatch.setenv("POLYMORPH_ENGINE", forms[1])
        assert main(["engine", "stop"]) == 0, capsys.readouterr().err
        os.waitpid(pid, 0)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
