"""`polymorph report DIR`: the chart data against report.json, the PNGs, the tune's best-so-far against
the board, bad input, and the path without matplotlib."""

from __future__ import annotations

import itertools
import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from polymorph.cli.command import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def check_against_report(data: dict, report: dict) -> None:
    """Every kernel of report.json once, in its order, with the report's figures unchanged."""
    assert [k["group"] for k in data["kernels"]] == [k["group"] for k in report["kernels"]]
    assert len({k["group"] for k in data["kernels"]}) == len(data["kernels"])
    for point, k in zip(data["kernels"], report["kernels"], strict=True):
        assert point["flops"] == k["flops"] and point["bytes"] == k["bytes"]
        assert point["predicted_s"] == k["predicted_s"] and point["measured_s"] == k.get("measured_s")
        floor = k["floor_s"] if k.get("floor_s") is not None else k["predicted_s"]
        assert point["floor_s"] == floor
        time_s = k["measured_s"] if k.get("measured_s") is not None else k["predicted_s"]
        assert point["time_s"] == time_s
        if k["bytes"]:
            assert point["intensity_flop_per_byte"] == pytest.approx(k["flops"] / k["bytes"])


def random_report(rng: random.Random) -> dict:
    """A report.json as a compile writes it, with random figures; some kernels measured."""
    kernels = []
    for layer in range(rng.randint(2, 5)):
        for part in ("attn.qkv", "attn.sdpa", "mlp.down+residual"):
            flops, nbytes = rng.uniform(1e6, 1e10), rng.uniform(1e5, 1e9)
            floor = max(flops / 989e12, nbytes / 4.8e12)
            predicted = floor * rng.uniform(1.0, 20.0)
            measured = predicted * rng.uniform(0.5, 2.0) if rng.random() < 0.5 else None
            kernels.append({"group": f"layers.{layer}.{part}", "kernel": f"triton/{part}.py@0123456789ab",
                            "target": "cuda:sm_90", "library": None, "resources": {}, "flops": flops,
                            "bytes": nbytes, "predicted_s": predicted, "bound": "memory", "measured_s": measured,
                            "note": "", "floor_s": floor})  # fmt: skip
    return {"backend": "cuda", "target": "cuda:sm_90", "profile": "h200", "model": "random",
            "bindings": {"batch": 1}, "kernels": kernels, "predicted_step_s": sum(k["predicted_s"] for k in kernels),
            "prediction": "cost model: test", "artifacts": [], "warnings": [], "schema_version": 1}  # fmt: skip


def test_report_data_and_chart_match_a_random_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    rng = random.Random(os.urandom(8))
    report = random_report(rng)
    (tmp_path / "report.json").write_text(json.dumps(report))
    assert main(["report", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "roofline.json").read_text())
    check_against_report(data, report)
    width, height = png_size(tmp_path / "roofline.png")
    assert 800 <= width <= 4000 and 400 <= height <= 3000
    # The table: its first row is the slowest role (the same group over layers), with its share.
    times: dict[str, float] = {}
    for k in report["kernels"]:
        role = k["group"].split(".", 2)[2]
        times[role] = times.get(role, 0.0) + (
            k["measured_s"] if k["measured_s"] is not None else k["predicted_s"]
        )
    slowest = max(times, key=times.__getitem__)
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines() if "\t" in line]
    assert rows[0][0] == "kernel" and rows[1][0] == f"layers.*.{slowest}"
    assert rows[1][3] == f"{times[slowest] / sum(times.values()):.0%}"


def test_report_of_a_gpu_compile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("triton")
    out = tmp_path / "tiny"
    assert main(["compile", "llama-tiny", "--backend", "cuda", "--target", "h200", "--out", str(out)]) == 0
    capsys.readouterr()
    charts = tmp_path / "charts"
    assert main(["report", str(out), "--out", str(charts)]) == 0
    report = json.loads((out / "report.json").read_text())
    data = json.loads((charts / "roofline.json").read_text())
    check_against_report(data, report)
    assert data["roof"] is not None and data["roof"]["peak_flop_per_s"] > 0
    assert any(k["floor_s"] and k["time_s"] for k in data["kernels"])
    width, height = png_size(charts / "roofline.png")
    assert 800 <= width <= 4000 and 400 <= height <= 3000
    assert "top kernels by time" in capsys.readouterr().out


def test_tune_progress_follows_the_board(tmp_path: Path) -> None:
    """A tune output's best-so-far: the board's passing results in order, stock over best-so-far summed
    over the op signatures by their group counts (the oracle below recomputes it)."""
    pytest.importorskip("matplotlib")
    from polymorph.search.board import Board

    rng = random.Random(os.urandom(8))
    scope = "b1-ctx512-1024@0123456789ab"
    sigs = {"sig-a": ["layers.0.a", "layers.1.a"], "sig-b": ["layers.0.b"]}
    stock = {"sig-a": rng.uniform(1e-4, 1e-3), "sig-b": rng.uniform(1e-4, 1e-3)}
    board = Board(tmp_path / "board.sqlite")
    expected, best = [], dict(stock)
    try:
        for i in range(8):
            sig = rng.choice(sorted(sigs))
            agent = "baseline" if i < 2 else "random"
            cid = board.post(group=f"{sigs[sig][0]}@{scope}", backend="cpu", target="cpu", config={"i": i},
                             agent=agent)  # fmt: skip
            claimed = board.claim("w", 60.0, backend="cpu", target="cpu")
            assert claimed is not None and claimed.id == cid
            ok = rng.random() < 0.8
            median = stock[sig] * rng.uniform(0.5, 1.2)
            board.post_result(
                cid, "w", ok, "" if ok else "numerics: off", {"median_s": median} if ok else {}, {}
            )
            if ok and agent != "baseline":
                best[sig] = min(best[sig], median)
                n = {s: len(g) for s, g in sigs.items()}
                expected.append(sum(n[s] * stock[s] for s in sigs) / sum(n[s] * best[s] for s in sigs))
    finally:
        board.close()
    tune = {"model": "m", "profile": "cpu", "buckets": [{"bucket": "b1-ctx512-1024", "signatures": [
        {"signature": s, "groups": g, "stock_s": stock[s], "best": None, "chosen": False} for s, g in sigs.items()
    ]}]}  # fmt: skip
    report = random_report(rng)
    (tmp_path / "report.json").write_text(json.dumps(report))
    (tmp_path / "tune-report.json").write_text(json.dumps(tune))
    assert main(["report", str(tmp_path)]) == 0
    progress = json.loads((tmp_path / "tune-progress.json").read_text())
    points = progress["buckets"][0]["points"]
    assert points[0]["speedup"] == 1.0
    assert [p["speedup"] for p in points[1:]] == pytest.approx(expected)
    assert all(b["t_s"] >= a["t_s"] for a, b in itertools.pairwise(points))
    width, height = png_size(tmp_path / "tune-progress.png")
    assert 600 <= width <= 4000 and 300 <= height <= 3000


@pytest.mark.parametrize("case", ["missing", "no-report", "not-json", "not-a-report", "a-file"])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    target = tmp_path / "dir"
    if case != "missing":
        target.mkdir()
    if case == "not-json":
        (target / "report.json").write_text("{ not json")
    if case == "not-a-report":
        (target / "report.json").write_text(json.dumps({"kernels": 3}))
    if case == "a-file":
        target.rmdir()
        target.write_text("x")
    assert main(["report", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("polymorph: error: ") and str(target) in err[0]
    assert not (target / "roofline.json").exists() if target.is_dir() else True


def test_without_matplotlib_the_data_and_a_warning(tmp_path: Path) -> None:
    report = random_report(random.Random(os.urandom(8)))
    (tmp_path / "report.json").write_text(json.dumps(report))
    code = ("import sys; sys.modules['matplotlib'] = None\n"  # what an environment without the extra sees
            "from polymorph.cli.command import main\n"
            f"sys.exit(main(['report', {str(tmp_path)!r}]))")  # fmt: skip
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    warnings = [line for line in p.stderr.splitlines() if line.startswith("polymorph: warning")]
    assert len(warnings) == 1 and "pip install 'polymorph[plot]'" in warnings[0]
    assert "Traceback" not in p.stderr
    check_against_report(json.loads((tmp_path / "roofline.json").read_text()), report)
    assert not (tmp_path / "roofline.png").exists()
    assert "top kernels by time" in p.stdout
