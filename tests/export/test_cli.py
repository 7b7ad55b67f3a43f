"""`polymorph run FILE.pt2 --inputs --outputs` and `polymorph verify FILE.pt2`, in-process through the
CLI's main: results against PyTorch eager, and bad input as one line with exit code 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from polymorph.cli.command import main
from polymorph.ir.dtypes import DType
from polymorph.verify.tolerance import compare, model_tolerance


@pytest.fixture(scope="module")
def conv_program(zoo: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    torch.manual_seed(7)
    module, example = zoo.conv()
    path = tmp_path_factory.mktemp("pt2") / "conv.pt2"
    torch.export.save(torch.export.export(module, example, strict=False), str(path))
    return path, module


def one_line_error(capsys: pytest.CaptureFixture[str], code: int, needle: str) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert needle in err, err
    return err


@pytest.mark.parametrize("backend", ["cpu", "neuron"])
@pytest.mark.parametrize("by_name", [False, True])
def test_run_matches_eager(
    conv_program: tuple[Path, Any], tmp_path: Path, backend: str, by_name: bool
) -> None:
    path, module = conv_program
    x = np.random.default_rng().standard_normal((2, 3, 16, 16)).astype(np.float32)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **({"x": x} if by_name else {"arr_0": x}))
    out = tmp_path / "out.npz"
    assert main(["run", str(path), "--inputs", str(inputs), "--outputs", str(out), "--backend", backend]) == 0
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    got = np.load(out)
    assert list(got.files) == ["output_0"]
    assert got["output_0"].dtype == np.float32  # the program's own dtype
    assert compare(got["output_0"], want, model_tolerance(DType.F32)).ok


def test_run_never_overwrites_unasked(conv_program: tuple[Path, Any], tmp_path: Path, capsys: Any) -> None:
    path, _ = conv_program
    inputs = tmp_path / "in.npz"
    np.savez(inputs, np.random.default_rng().standard_normal((2, 3, 16, 16)).astype(np.float32))
    out = tmp_path / "out.npz"
    out.write_bytes(b"keep me")
    code = main(["run", str(path), "--inputs", str(inputs), "--outputs", str(out)])
    one_line_error(capsys, code, "exists")
    assert out.read_bytes() == b"keep me"
    assert main(["run", str(path), "--inputs", str(inputs), "--outputs", str(out), "--force"]) == 0
    assert "output_0" in np.load(out).files


@pytest.mark.parametrize("backend", ["cpu", "neuron"])
def test_verify_against_pytorch(conv_program: tuple[Path, Any], backend: str, capsys: Any) -> None:
    path, _ = conv_program
    assert main(["verify", str(path), "--backend", backend]) == 0
    assert "every output matches PyTorch" in capsys.readouterr().out


def test_missing_file(tmp_path: Path, capsys: Any) -> None:
    inputs = tmp_path / "in.npz"
    np.savez(inputs, np.zeros(3, np.float32))
    code = main(
        ["run", str(tmp_path / "nope.pt2"), "--inputs", str(inputs), "--outputs", str(tmp_path / "o.npz")]
    )
    one_line_error(capsys, code, "no such file")
    one_line_error(capsys, main(["verify", str(tmp_path / "nope.pt2")]), "no such file")


def test_unknown_op(tmp_path: Path, capsys: Any) -> None:
    class Sorts(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sort(x, dim=-1).values * 2

    path = tmp_path / "sorts.pt2"
    torch.export.save(torch.export.export(Sorts(), (torch.randn(4, 5),), strict=False), str(path))
    one_line_error(capsys, main(["verify", str(path)]), "ATen op `aten.sort.default` (node `sort`)")


def test_wrong_input_count(conv_program: tuple[Path, Any], tmp_path: Path, capsys: Any) -> None:
    path, _ = conv_program
    inputs = tmp_path / "in.npz"
    x = np.zeros((2, 3, 16, 16), np.float32)
    np.savez(inputs, x, x)
    code = main(["run", str(path), "--inputs", str(inputs), "--outputs", str(tmp_path / "o.npz")])
    one_line_error(capsys, code, "takes 1 input(s) (x), 2 given")
    assert not (tmp_path / "o.npz").exists()


def test_wrong_input_shape(conv_program: tuple[Path, Any], tmp_path: Path, capsys: Any) -> None:
    path, _ = conv_program
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.zeros((1, 3, 16, 16), np.float32))
    code = main(["run", str(path), "--inputs", str(inputs), "--outputs", str(tmp_path / "o.npz")])
    one_line_error(capsys, code, "input `x` has shape [1, 3, 16, 16]")


def test_a_file_that_is_not_a_program(tmp_path: Path) -> None:
    """Random bytes named .pt2: one line, exit 2, and no traceback from torch's loader on stderr (a
    subprocess: pytest would capture the logger's output itself)."""
    import subprocess
    import sys

    bad = tmp_path / "bad.pt2"
    bad.write_bytes(np.random.default_rng().integers(0, 256, 512, dtype=np.uint8).tobytes())
    done = subprocess.run([sys.executable, "-m", "polymorph", "verify", str(bad)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "not a torch.export program" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
