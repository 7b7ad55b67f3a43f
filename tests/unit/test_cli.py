"""The `polymorph` command line: every command in-process through `cli.main`, and a few through a real
process to see the real exit code and that an error is one line on stderr, never a traceback.

Exit codes (DESIGN.md): 0 done; 1 a check failed; 2 bad input, bad usage or a missing dependency.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import polymorph
from polymorph.cli import command as cli
from polymorph.ir import content_hash, from_json, verify
from polymorph.ir import serialize as ir_serialize
from polymorph.knobs import knobs
from polymorph.models import load_model
from polymorph.pipeline.backend import Capability, Probe, registry

VENDOR_CHIPS = ["b200", "gb300", "h100", "h200", "mi300x", "mi355x", "trn2"]
ALL_CHIPS = sorted([*VENDOR_CHIPS, "cpu"])
BACKENDS = ["cpu", "cuda", "rocm", "neuron"]
VOCAB = 256  # llama-tiny's vocabulary
PREFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


@pytest.fixture(autouse=True)
def clean_knobs(monkeypatch: pytest.MonkeyPatch):
    """Every test sees the knobs' defaults, whatever the caller's environment sets."""
    for key in [k for k in os.environ if k.startswith("POLYMORPH_")]:
        monkeypatch.delenv(key)
    with knobs.scope():
        yield


def cli_run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> str:
    """Exit 2 and exactly one `polymorph: error:` line naming each of `needles`; return the line."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    line = lines[0]
    assert line.startswith("polymorph: error: "), line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert code == 2, f"exit code {code} for {line!r}"
    return line


def subprocess_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("POLYMORPH_")}
    base["POLYMORPH_PLAIN"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "polymorph", *argv],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=120,
    )


def table_rows(out: str) -> list[list[str]]:
    """Rows of a plain (tab-separated) table: the lines after the `# title` and the header."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# ")) + 2
    rows = []
    for line in lines[start:]:
        if "\t" not in line:
            break
        rows.append(line.split("\t"))
    return rows


def quantity(text: str, label: str, unit: str) -> float:
    """The number printed after `label` as `<x> <prefix><unit>`, in base units."""
    m = re.search(rf"{label} ([\d.,]+) ([kMGTP]?){unit}\b", text)
    assert m, f"no `{label} <x> {unit}` in:\n{text}"
    return float(m.group(1).replace(",", "")) * PREFIX[m.group(2)]


def printed_tokens(out: str) -> list[int]:
    m = re.search(r"^tokens: (.*)$", out, re.MULTILINE)
    assert m, out
    return [int(t) for t in m.group(1).split()]


# --- commands that work ------------------------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"polymorph {polymorph.__version__}"


def test_version_in_a_real_process() -> None:
    p = subprocess_cli("--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"polymorph {polymorph.__version__}"
    assert p.stderr == ""


def test_backends_lists_every_in_tree_backend_and_cpu_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli_run(capsys, "backends")
    assert code == 0, err
    rows = {r[0]: r for r in table_rows(out)}
    assert set(BACKENDS) <= set(rows), out
    cpu = rows["cpu"]
    assert cpu[1] == "cpu"
    assert cpu[2:5] == ["yes", "yes", "yes"], cpu  # compile, run, measure
    for name in BACKENDS:
        assert rows[name][3] in ("yes", "no")
        if rows[name][3] == "no":
            assert rows[name][5], f"{name} cannot run here but gives no reason"


def test_hw_lists_all_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli_run(capsys, "hw")
    assert code == 0, err
    rows = table_rows(out)
    assert sorted(r[0] for r in rows) == ALL_CHIPS


@pytest.mark.parametrize("calibrated", [False, True])
def test_hw_h200_llama_1b_roofline(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calibrated: bool
) -> None:
    """Vendor figures (an empty calibration directory) or the committed H200 calibration."""
    if not calibrated:
        monkeypatch.setenv("POLYMORPH_CALIBRATION_DIR", str(tmp_path))
    code, out, err = cli_run(capsys, "hw", "h200", "--model", "llama-3.2-1b")
    assert code == 0, err
    moved = quantity(out, "bytes moved", "B")
    weights = quantity(out, r"\(weights", "B")
    flops = quantity(out, "FLOPs", "FLOP")
    # llama-3.2-1b: 1.24e9 params (tied embeddings) at bf16 = 2.47 GB; a decode step reads them all.
    assert 2.4e9 <= weights <= 2.55e9
    assert weights <= moved <= 2.6e9
    assert 2.0e9 <= flops <= 3.5e9  # ~2 FLOPs per weight, plus attention over 1024 tokens
    m = re.search(r"roofline floor ([\d.,]+) (s|ms|us) \(memory-bound", out)
    assert m, out
    floor = float(m.group(1).replace(",", "")) * SECONDS[m.group(2)]
    if calibrated:  # hwprofiles/measured/h200.toml: 4.19 TB/s read at 1 GiB
        assert "measured calibration" in out
        assert floor == pytest.approx(moved / 4190.68e9, rel=0.01)
    else:
        assert "measured calibration" not in out
        assert floor == pytest.approx(moved / 4.8e12, rel=0.01)  # H200: 4.8 TB/s
    assert 0.45e-3 <= floor <= 0.62e-3


@pytest.mark.parametrize("chip", VENDOR_CHIPS)
def test_hw_model_on_every_vendor_chip(capsys: pytest.CaptureFixture[str], chip: str) -> None:
    code, out, err = cli_run(capsys, "hw", chip, "--model", "llama-3.2-1b")
    assert code == 0, err
    assert re.search(r"roofline floor [\d.,]+ (s|ms|us) \(memory-bound", out), out


def test_graph_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli_run(capsys, "graph", "llama-tiny")
    assert code == 0, err
    assert out.startswith("graph llama-tiny")
    assert "param model.embed_tokens.weight: f32[256, 64]" in out


def test_graph_json_round_trips(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli_run(capsys, "graph", "llama-tiny", "--json")
    assert code == 0, err
    graph = from_json(out)
    verify(graph)
    assert content_hash(graph) == content_hash(load_model("llama-tiny").graph)


def test_compile_writes_plan_report_and_graph(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_dir = tmp_path / "llama-1b-cpu"
    code, out, err = cli_run(capsys, "compile", "llama-3.2-1b", "--backend", "cpu", "--out", str(out_dir))
    assert code == 0, err
    plan = json.loads((out_dir / "plan.json").read_text())
    report = json.loads((out_dir / "report.json").read_text())
    graph = ir_serialize.load(out_dir / "graph.json")
    assert isinstance(plan["schema_version"], int)
    assert isinstance(report["schema_version"], int)
    ids = [g["id"] for g in plan["groups"]]
    assert len(ids) == len(set(ids)), "plan group ids are not unique"
    assert [k["group"] for k in report["kernels"]] == ids  # one report entry per plan group
    assert plan["backend"] == report["backend"] == "cpu"
    assert plan["graph_sha256"] == content_hash(graph) == content_hash(load_model("llama-3.2-1b").graph)
    for name in report["artifacts"]:
        assert (out_dir / name).is_file(), name
    assert f"wrote {out_dir}/plan.json" in out


# AMDGCN instructions that read or write LDS (ds_swizzle and ds_(b)permute only cross lanes).
LDS_ACCESS = re.compile(
    r"\bds_(?!swizzle|permute|bpermute)\w+|\bglobal_load_lds_\w+|\bbuffer_load_\w+[^\n]*\blds\b"
)


def test_compile_prints_each_kernels_resources(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The compile table (plain, tab-separated here) shows each kernel's VGPRs, spills, LDS and occupancy
    as report.json states them; a kernel reports LDS exactly when its AMDGCN touches LDS."""
    pytest.importorskip("triton")
    from polymorph.cli.console import quantity

    out_dir = tmp_path / "tiny-mi355x"
    argv = ["compile", "llama-tiny", "--backend", "rocm", "--target", "mi355x", "--batch", "32"]
    code, out, err = cli_run(capsys, *argv, "--out", str(out_dir))
    assert code == 0, err
    report = json.loads((out_dir / "report.json").read_text())
    devices = json.loads((out_dir / "device" / "groups.json").read_text())
    assert any(k["resources"].get("lds_bytes") for k in report["kernels"])
    lines = out.splitlines()
    header = lines.index("group\tkernel\tregisters\tspills\tshared/LDS\toccupancy\tpredicted")
    rows = {r[0]: r for r in (line.split("\t") for line in lines[header + 1 :]) if len(r) == 7}
    assert set(rows) == {k["group"] for k in report["kernels"]}
    for k in report["kernels"]:
        group, kernel, regs, spills, lds, occupancy, predicted = rows[k["group"]]
        res = k["resources"]
        if k["library"]:
            assert kernel.endswith(f"({k['library']})") and regs == spills == lds == occupancy == "-"
            continue
        asm = "\n".join((out_dir / "device" / f"{key}.amdgcn").read_text() for key in devices[group])
        assert (res["lds_bytes"] > 0) == bool(LDS_ACCESS.search(asm)), f"{group}: {res}"
        assert lds == quantity(res["lds_bytes"], "B")
        assert regs.startswith(f"{res['vgprs']} VGPR")
        assert spills == "0" and res["vgpr_spills"] == res["sgpr_spills"] == 0
        assert occupancy == f"{res['occupancy']:.0%} ({res['limited_by']})"


def test_run_prints_the_new_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli_run(capsys, "run", "llama-tiny", "--prompt", "1 2 3", "--new-tokens", "4")
    assert code == 0, err
    tokens = printed_tokens(out)
    assert len(tokens) == 4
    assert all(0 <= t < VOCAB for t in tokens)


def test_run_from_a_compile_output_gives_the_same_tokens(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_dir = tmp_path / "tiny"
    assert cli_run(capsys, "compile", "llama-tiny", "--out", str(out_dir))[0] == 0
    code, out, err = cli_run(capsys, "run", str(out_dir), "--prompt", "5,6,7,8", "--new-tokens", "6")
    assert code == 0, err
    from_dir = printed_tokens(out)
    code, out, err = cli_run(capsys, "run", "llama-tiny", "--prompt", "5 6 7 8", "--new-tokens", "6")
    assert code == 0, err
    assert from_dir == printed_tokens(out)
    assert len(from_dir) == 6


def test_run_from_a_compile_output_uses_its_own_kernel_copies(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from polymorph.pipeline import kernel_files

    out_dir = tmp_path / "tiny"
    assert cli_run(capsys, "compile", "llama-tiny", "--out", str(out_dir))[0] == 0
    code, out, err = cli_run(capsys, "run", str(out_dir), "--prompt", "1 2", "--new-tokens", "3")
    assert code == 0, err
    want = printed_tokens(out)
    # The checkout's kernel library is gone (an installed wheel of another version, an edited file):
    # the compile output still holds every kernel it needs.
    empty = tmp_path / "no-kernels"
    empty.mkdir()
    monkeypatch.setattr(kernel_files, "kernels_root", lambda: empty)
    code, out, err = cli_run(capsys, "run", str(out_dir), "--prompt", "1 2", "--new-tokens", "3")
    assert code == 0, err
    assert printed_tokens(out) == want


def word_tokenizer(path: Path):
    """A WordLevel tokenizer over `w0`..`w255`: the word `wN` is token id N (llama-tiny's vocab)."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return tok


def test_run_text_with_a_tokenizer(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    tok = word_tokenizer(tmp_path / "tok.json")
    tok_file = str(tmp_path / "tok.json")
    code, out, err = cli_run(
        capsys, "run", "llama-tiny", "--text", "w9 w4 w200", "--tokenizer", tok_file, "--new-tokens", "5"
    )
    assert code == 0, err
    tokens = printed_tokens(out)
    assert re.search(r"^text: (.*)$", out, re.MULTILINE).group(1) == tok.decode(tokens)
    # The text went through the tokenizer: the same ids as a prompt give the same generation.
    code, out, err = cli_run(capsys, "run", "llama-tiny", "--prompt", "9 4 200", "--new-tokens", "5")
    assert code == 0, err
    assert printed_tokens(out) == tokens


@pytest.mark.parametrize("model", ["llama-tiny", "moe-tiny", "qwen3-moe-tiny"])
def test_verify_tiny_models(capsys: pytest.CaptureFixture[str], model: str) -> None:
    code, out, err = cli_run(capsys, "verify", model)
    assert code == 0, err
    assert "logits match the reference at every step" in out


def test_verify_mismatch_exits_1(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from polymorph import api
    from polymorph.verify import StepCheck, VerifyResult
    from polymorph.verify.tolerance import Tolerance, compare

    def failing_verify(model, backend, *, seed=None):
        tol = Tolerance(1e-3, 1e-4)
        bad = compare(np.ones((1, 1, 4), np.float32), np.zeros((1, 1, 4), np.float32), tol)
        return VerifyResult(tol, [StepCheck("prefill seq 0 (7 tokens)", bad)])

    monkeypatch.setattr(api, "verify", failing_verify)
    code, _, err = cli_run(capsys, "verify", "llama-tiny")
    assert code == 1
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1
    assert err.startswith("polymorph: check failed: llama-tiny on cpu: prefill seq 0")


def cannot_compile(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make backend `name` report that it cannot compile here (whatever this machine has)."""
    cls = type(registry.get(name))
    no = Capability(False, f"{name} compile switched off by the test")
    monkeypatch.setattr(cls, "probe", lambda self: Probe(name, no, no, no))


def test_demo_keeps_its_folder_and_runs_every_step(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One whole demo in a folder a previous demo left (it may be written again): cuda compiles for
    real (its resource table), rocm cannot compile here (the one install line), and neuron's lowering
    fails for want of a kernel (one warning line, the demo goes on)."""
    cls = type(registry.get("rocm"))
    no = Capability(False, "Triton is not installed: pip install 'polymorph[rocm]'")
    monkeypatch.setattr(cls, "probe", lambda self: Probe("rocm", no, no, no))
    from polymorph.pipeline import kernel_files, lowering

    real_library = kernel_files.kernel_library

    def without_embedding(language: str):
        kernels = real_library(language)
        return [k for k in kernels if "embedding" not in k.implements] if language == "xla" else kernels

    monkeypatch.setattr(kernel_files, "kernel_library", without_embedding)
    monkeypatch.setattr(lowering, "kernel_library", without_embedding)
    monkeypatch.chdir(tmp_path)
    from polymorph.cli.outdir import claim_out, manifest_command

    claim_out("polymorph-demo", "demo")
    (tmp_path / "polymorph-demo" / "stale.txt").write_text("from the previous demo")

    code, out, err = cli_run(capsys, "demo", "--budget", "10s")
    assert code == 0, err
    assert "seeded random weights" in out and "repeat" in out  # says why its tokens mean nothing
    assert "output folder: polymorph-demo/" in out
    assert "layer 0:" in out and "= cache_attention(" in out  # the graph, short
    assert "logits match" not in out and "MISMATCH" not in out
    assert re.search(r"^decode step 3 \(batch 2, ragged\)\tok\t", out, re.M), out  # verify's table
    assert re.search(r"^# h200 \(cuda:sm_90\): 16 kernels", out, re.M), out
    assert "\tregisters\tspills\tshared/LDS\toccupancy\t" in out  # the per-kernel resource table
    assert "not compiled here: mi355x; to compile them: pip install 'polymorph[rocm]'" in out
    warnings = [x for x in err.splitlines() if x.startswith("polymorph: warning: ")]
    assert any(x.startswith("polymorph: warning: neuron for trn2: not compiled:") and "`embedding`" in x
               for x in warnings), err  # fmt: skip
    assert "Traceback" not in err
    # the hot swap: every gate passed and the candidate stayed in
    gates = re.findall(r"^([a-z_.]+)\t(pass|fail|not run)\t", out, re.M)
    assert ("numerics", "pass") in gates and ("state.weights", "pass") in gates, out
    assert all(verdict == "pass" for _, verdict in gates), gates
    assert "it stays in" in out
    assert "6. a short tune: polymorph tune llama-tiny --backend cpu --budget 10s" in out
    assert re.search(r"^   # bucket \S+ .*candidates", out, re.M), out  # the tune's own table, shown
    # the folder stays, with what each step wrote; the previous demo's file is left alone
    demo = tmp_path / "polymorph-demo"
    assert manifest_command(demo) == "demo"
    assert (demo / "stale.txt").read_text() == "from the previous demo"
    for path in ("cpu/plan.json", "cpu/report.json", "h200/plan.json", "candidates/linear_residual_addmm.py",
                 "tune/plan.json", "tune/tune-report.json", "tune/registry.sqlite", "tune-output.txt"):  # fmt: skip
        assert (demo / path).is_file(), path
    assert not (demo / "mi355x").exists() and not (demo / "trn2" / "plan.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["polymorph-demo"]  # nothing else written
    assert "polymorph run polymorph-demo/cpu" in out


@pytest.mark.parametrize("previous", [None, "compile"])
def test_demo_refuses_a_folder_that_is_not_a_demos(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, previous: str | None
) -> None:
    from polymorph.cli.outdir import claim_out

    mine = tmp_path / "mine"
    if previous:
        claim_out(mine, previous)
    mine.mkdir(exist_ok=True)
    (mine / "notes.txt").write_text("a user's file")
    before = sorted(p.name for p in mine.iterdir())
    code, out, err = cli_run(capsys, "demo", "--out", str(mine))
    assert_one_line_error(code, err, str(mine), "not empty", "--force")
    assert out == ""  # refused before any step
    assert sorted(p.name for p in mine.iterdir()) == before
    assert (mine / "notes.txt").read_text() == "a user's file"


def test_demo_bad_budget_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = cli_run(capsys, "demo", "--out", str(tmp_path / "d"), "--budget", "soon")
    assert_one_line_error(code, err, "--budget", "soon")
    assert not (tmp_path / "d").exists()


def test_no_command_shows_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli_run(capsys)
    assert code == 2
    assert "usage: polymorph" in out + err


# --- bad input: exit 2, one line naming the cause -----------------------------------------------------


BAD_INPUT = [
    (["run", "no-such-model"], ["unknown model `no-such-model`", "llama-tiny"]),
    (["compile", "llama-tiny", "--backend", "no-such-backend"], ["unknown backend `no-such-backend`", "cpu"]),
    (["verify", "llama-tiny", "--backend", "no-such-backend"], ["unknown backend `no-such-backend`"]),
    (["hw", "no-such-chip"], ["no-such-chip", "h200"]),
    (["compile", "llama-tiny", "--backend", "cpu", "--target", "h200"], ["`cpu`", "`h200`"]),
    (["compile", "llama-tiny", "--target", "no-such-chip"], ["no-such-chip"]),
    (["frobnicate"], ["frobnicate"]),
    (["run", "llama-tiny", "--no-such-flag"], ["--no-such-flag"]),
    (["run", "llama-tiny", "--new-tokens", "many"], ["--new-tokens", "many"]),
    (["run", "llama-tiny", "--text", "w1 w2"], ["--tokenizer"]),
    (["run", "llama-tiny", "--prompt", "1 256"], ["token ids", "256"]),
    (["run", "llama-tiny", "--prompt", "1 -3"], ["token ids", "-3"]),
    (["run", "llama-tiny", "--prompt", "one two"], ["--prompt", "one two"]),
    (["run", "llama-tiny", "--prompt", ""], ["prompt"]),
    (["run", "llama-tiny", "--new-tokens", "0"], ["--new-tokens"]),
]


@pytest.mark.parametrize(("argv", "needles"), BAD_INPUT, ids=[" ".join(a) or "<empty>" for a, _ in BAD_INPUT])
def test_bad_input_is_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needles: list[str]
) -> None:
    code, out, err = cli_run(capsys, *argv)
    assert_one_line_error(code, err, *needles)


def test_a_backend_that_cannot_lower_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    cuda = registry.get("cuda")
    probe = cuda.probe()
    graph_ops = {n.op for n in load_model("llama-tiny", dtype="bf16").graph.nodes}
    if probe.compile.ok:
        missing = sorted(graph_ops - cuda.ops())
        if not missing:
            pytest.skip("cuda lowers every op of llama-tiny here: nothing to refuse")
        needles = ["cuda", "has no kernel", "backends that support it"]
    else:
        needles = ["cuda", probe.compile.reason]
    code, out, err = cli_run(capsys, "compile", "llama-tiny", "--backend", "cuda")
    assert_one_line_error(code, err, *needles)


def test_an_unsupported_op_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cpu kernel library without its embedding kernel: lowering must name the op and the backend.
    from polymorph.pipeline import kernel_files, lowering

    real_library = kernel_files.kernel_library

    def without_embedding(language: str):
        return [k for k in real_library(language) if "embedding" not in k.implements]

    monkeypatch.setattr(kernel_files, "kernel_library", without_embedding)
    monkeypatch.setattr(lowering, "kernel_library", without_embedding)
    code, out, err = cli_run(capsys, "compile", "llama-tiny", "--backend", "cpu")
    assert_one_line_error(code, err, "`embedding`", "cpu")


def test_bad_json_config_in_a_model_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model_dir = tmp_path / "broken"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "llama", ')
    code, out, err = cli_run(capsys, "run", str(model_dir))
    assert_one_line_error(code, err, "config.json", "JSON")


def test_unknown_model_type_in_a_model_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model_dir = tmp_path / "gpt2ish"
    model_dir.mkdir()
    config = {"model_type": "gpt2", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1}
    (model_dir / "config.json").write_text(json.dumps(config))
    code, out, err = cli_run(capsys, "compile", str(model_dir))
    assert_one_line_error(code, err, "config.json", "gpt2", "llama")


def test_model_dir_without_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = cli_run(capsys, "run", str(tmp_path))
    assert_one_line_error(code, err, "config.json")


def test_malformed_ir_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "graph.json"
    path.write_text('{"schema_version": 1, "nodes": [')
    code, out, err = cli_run(capsys, "compile", str(path))
    assert_one_line_error(code, err, str(path), "not valid JSON")


def test_ir_json_with_the_wrong_schema(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "graph.json"
    path.write_text(json.dumps({"schema_version": 99, "name": "x"}))
    code, out, err = cli_run(capsys, "run", str(path))
    assert_one_line_error(code, err, str(path), "schema_version")


def test_ir_json_that_fails_verification(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    d = json.loads(ir_serialize.to_json(load_model("llama-tiny").graph))
    d["params"]["model.layers.0.mlp.down_proj.weight"]["shape"] = [64, 127]  # the linear's K is 128
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(d))
    code, out, err = cli_run(capsys, "compile", str(path))
    assert_one_line_error(code, err, "layers.0.mlp.down", "127")


def test_a_valid_ir_json_file_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "graph.json"
    ir_serialize.save(load_model("llama-tiny").graph, path)
    code, out, err = cli_run(capsys, "run", str(path), "--prompt", "1 2 3", "--new-tokens", "3")
    assert code == 0, err
    assert len(printed_tokens(out)) == 3


def test_tokenizer_file_that_cannot_be_read(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    missing = tmp_path / "nope.json"
    code, out, err = cli_run(capsys, "run", "llama-tiny", "--text", "w1", "--tokenizer", str(missing))
    assert_one_line_error(code, err, str(missing))


def test_missing_tokenizers_names_the_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` now raises ImportError
    code, out, err = cli_run(
        capsys, "run", "llama-tiny", "--text", "w1 w2", "--tokenizer", str(tmp_path / "t.json")
    )
    assert_one_line_error(code, err, "tokenizers", "polymorph[text]")


def test_a_model_larger_than_memory(capsys: pytest.CaptureFixture[str]) -> None:
    with knobs.scope(memory_limit_gb=1):
        code, out, err = cli_run(capsys, "run", "llama-3.1-8b", "--new-tokens", "1")
    line = assert_one_line_error(code, err, "llama-3.1-8b", "GB")
    need = float(re.search(r"needs about ([\d.]+) GB", line).group(1))
    assert need >= 32.0  # 8.0e9 f32 weights are 32.1 GB before any copy
    assert re.search(r"1(\.0)? GB available", line), line


def test_a_bad_knob_value(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYMORPH_SEED", "abc")
    code, out, err = cli_run(capsys, "run", "llama-tiny", "--new-tokens", "1")
    assert_one_line_error(code, err, "POLYMORPH_SEED", "abc")


@pytest.mark.parametrize("command", ["run", "compile", "verify", "graph"])
def test_unknown_dtype_is_one_line(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, err = cli_run(capsys, command, "llama-tiny", "--dtype", "f99")
    assert_one_line_error(code, err, "f99", "bf16")


# --- the same errors through a real process ----------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["frobnicate"], {}, "frobnicate"),
        (["run", "no-such-model"], {}, "no-such-model"),
        (["compile", "llama-tiny", "--backend", "cpu", "--target", "h200"], {}, "h200"),
        (["run", "llama-tiny"], {"POLYMORPH_SEED": "abc"}, "POLYMORPH_SEED"),
        (["run", "llama-3.1-8b"], {"POLYMORPH_MEMORY_LIMIT_GB": "1"}, "GB"),
    ],
    ids=["bad-command", "unknown-model", "target-not-served", "bad-knob", "too-large"],
)
def test_errors_in_a_real_process(argv: list[str], env: dict[str, str], needle: str) -> None:
    p = subprocess_cli(*argv, env=env)
    assert_one_line_error(p.returncode, p.stderr, needle)
    assert p.stdout == ""


# --- known bugs (strict xfail: each turns into a failure once fixed, so the marker comes off) ----------


@pytest.mark.parametrize("flag", ["--batch", "--ctx"])
def test_zero_batch_or_ctx_is_refused(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    code, out, err = cli_run(capsys, "compile", "llama-tiny", flag, "0")
    assert_one_line_error(code, err, flag)


def test_out_that_is_a_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "a-file"
    path.write_text("")
    code, out, err = cli_run(capsys, "compile", "llama-tiny", "--out", str(path))
    assert_one_line_error(code, err, str(path))
