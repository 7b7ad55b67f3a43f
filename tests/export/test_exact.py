"""Bit-exact mode on an imported program (the conv encoder/decoder of zoo.py) on cpu: `tune --exact`
keeps only candidates whose outputs equal the stock kernel's byte for byte, the `exact` gate rejects a
config that is right within tolerance but not bit-identical (and without --exact the same config
passes numerics), and the program's one bucket is its example inputs' shapes.

The bit-exactness of what passed is checked here, not taken from the gates: each passed candidate's
kernel is built afresh in this process at its group's spec, run beside the stock config on fresh
inputs (on the engine's thread count), and the bytes compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from polymorph.cli.command import main
from polymorph.engine.controller import Controller
from polymorph.engine.gates import EXACT, NUMERICS
from polymorph.frontend import load_pt2
from polymorph.search.board import Board

CONV_GROUP = "dec.convolution_3"  # conv 24 -> 8 channels, 3x3, padding 1
NOT_EXACT = {"conv": "im2col"}  # torch's unfold + matmul: another summation order than torch's conv


@pytest.fixture(scope="module")
def conv_file(zoo: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(7)
    module, example = zoo.conv()
    path = tmp_path_factory.mktemp("pt2") / "conv.pt2"
    torch.export.save(torch.export.export(module, example, strict=False), str(path))
    return path


@pytest.fixture(scope="module")
def engine(conv_file: Path) -> Any:
    with Controller.start(str(conv_file), "cpu") as e:
        yield e


def _outputs(plan: Any, group: Any, config: dict[str, Any], inputs: list[Any]) -> list[np.ndarray]:
    """`group`'s kernel built here with `config`, run once on `inputs`: its outputs."""
    from polymorph.pipeline.kernel_files import load_choice
    from polymorph.pipeline.lowering import kernel_spec

    graph, types = plan.concrete()
    spec = kernel_spec(graph, group, types, plan.kernel_target())
    kernel = load_choice(group.kernel.file, group.kernel.sha256)
    launch = kernel.build(spec, config, plan.kernel_target())
    outs = [torch.full(tuple(types[v].shape), float("nan"), dtype=torch.float32) for v in group.outputs]
    launch(inputs, outs, None)
    return [o.numpy().copy() for o in outs]


def _bitwise_to_stock(model: Any, group_id: str, config: dict[str, Any], seed: int) -> bool:
    """On the threads the engine's workers and the cpu executable run the model with: a oneDNN
    convolution's summation order, and so its bits, depend on the thread count."""
    from polymorph.engine.pool import _threads

    before = torch.get_num_threads()
    torch.set_num_threads(_threads(model))
    try:
        return _bitwise_on_threads(model, group_id, config, seed)
    finally:
        torch.set_num_threads(before)


def _bitwise_on_threads(model: Any, group_id: str, config: dict[str, Any], seed: int) -> bool:
    from polymorph import api

    plan = api.compile(model, "cpu").plan
    group = next(g for g in plan.groups if g.id == group_id)
    _, types = plan.concrete()
    rng = np.random.default_rng(seed)
    weights = model.weights()
    same = True
    for _ in range(2):  # two fresh draws
        inputs = [
            torch.from_numpy(np.asarray(weights[v]).copy())
            if v in weights
            else torch.from_numpy(rng.standard_normal(tuple(types[v].shape)).astype(np.float32))
            for v in group.inputs
        ]
        stock = _outputs(plan, group, dict(group.kernel.config), inputs)
        got = _outputs(plan, group, config, inputs)
        same &= all(a.tobytes() == b.tobytes() for a, b in zip(got, stock, strict=True))
    return same


def _general_kernel() -> Any:
    import importlib.util

    from polymorph.pipeline.kernel_files import kernels_root

    spec = importlib.util.spec_from_file_location("general_kernel", kernels_root() / "torch" / "general.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONV_CASES = [  # (x shape, w shape, bias, stride, padding, dilation, groups)
    ((2, 4, 11), (6, 2, 3), True, (2,), (1,), (2,), 2),
    ((2, 3, 9, 8), (5, 3, 3, 2), False, (1, 2), (1, 0), (1, 1), 1),
    ((2, 4, 10, 9), (4, 2, 3, 3), True, (1, 1), (2, 2), (2, 2), 2),
    ((1, 2, 5, 6, 4), (2, 1, 2, 3, 2), True, (1, 2, 1), (0, 1, 1), (2, 1, 1), 2),
]


@pytest.mark.parametrize("config", _general_kernel().CONFIGS, ids=json.dumps)
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_every_config_matches_the_reference(config: dict[str, Any], case: int) -> None:
    """Each config of general.py is a correct implementation: within the op tolerance of the numpy
    reference (polymorph/ir/general_reference.py) on fresh inputs, for conv and the reductions."""
    from polymorph.ir.dtypes import DType
    from polymorph.ir.general_reference import GENERAL_REFERENCE
    from polymorph.verify.tolerance import compare, op_tolerance

    kernel = _general_kernel()
    seed = int(np.random.default_rng().integers(2**31))
    rng = np.random.default_rng(seed)
    xs, ws, bias, stride, padding, dilation, groups = CONV_CASES[case]
    ins = [rng.uniform(-4, 4, xs).astype(np.float32), rng.uniform(-1, 1, ws).astype(np.float32)]
    if bias:
        ins.append(rng.uniform(-1, 1, ws[0]).astype(np.float32))
    attrs = {"stride": list(stride), "padding": list(padding), "dilation": list(dilation), "groups": groups}
    checks = [("conv", ins, attrs)]
    for op in ("reduce_sum", "reduce_mean", "reduce_var"):
        r_attrs = {"axes": [1, -1], "keepdims": op == "reduce_mean"}
        if op == "reduce_var":
            r_attrs["correction"] = 1
        checks.append((op, [ins[0] + 100.0], r_attrs))  # an offset: f32 accumulation loses digits
    tol = op_tolerance(DType.F32)
    for op, args, a in checks:
        (want,) = GENERAL_REFERENCE[op](args, a)
        got = kernel.compute(op, [torch.from_numpy(t) for t in args], a, None, config).float().numpy()
        c = compare(got, np.asarray(want, dtype=np.float32), tol)
        assert c.ok, f"{op} {config} case {case}: {c} (seed {seed})"


def test_an_unknown_config_is_refused() -> None:
    kernel = _general_kernel()
    with pytest.raises(ValueError, match="no config conv='winograd'"):
        kernel.build(None, {"conv": "winograd"}, None)


def test_im2col_is_right_but_not_bit_exact(conv_file: Path) -> None:
    """The premise: the non-exact config is within tolerance of the stock one and not bit-identical."""
    model = load_pt2(str(conv_file))
    seed = int(np.random.default_rng().integers(2**31))
    assert not _bitwise_to_stock(model, CONV_GROUP, NOT_EXACT, seed), f"seed {seed}"


def test_exact_gate_rejects_a_config_that_passes_numerics(engine: Any) -> None:
    assert engine.program
    _, plain = engine.try_candidate(CONV_GROUP, "kernels/torch/general.py", NOT_EXACT)
    assert plain is not None and plain.ok, [(g.name, g.verdict, g.cause) for g in plain.gates]
    assert plain.gate(NUMERICS).verdict == "pass"
    assert EXACT not in {g.name for g in plain.gates}  # outside exact mode there is no such gate
    # The state gates have nothing to check in a program: not applicable, not failed.
    assert {g.name: g.verdict for g in plain.gates if g.name in ("quality", "kv_isolation")} == {
        "quality": "skipped",
        "kv_isolation": "skipped",
    }

    _, exact = engine.try_candidate(CONV_GROUP, "kernels/torch/general.py", NOT_EXACT, exact=True)
    assert exact is not None and not exact.ok
    gate = exact.gate(EXACT)
    assert gate.verdict == "fail" and "not bit-exact" in gate.cause, gate.cause
    assert exact.gate(NUMERICS).verdict == "pass"  # right within tolerance: only exactness failed it
    assert any(f.stage == EXACT for f in exact.faults)

    _, stock = engine.try_candidate(CONV_GROUP, "kernels/torch/general.py", {}, exact=True)
    assert stock is not None and stock.ok, [(g.name, g.verdict, g.cause) for g in stock.gates]
    assert stock.gate(EXACT).verdict == "pass"


def test_tune_exact_keeps_only_bit_exact_candidates(conv_file: Path, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "tuned"
    code = main([
        # 90 s is a ceiling, not a wait: the search stops once the agents have nothing left to propose,
        # and a loaded 2-core machine spent 40 s on the stock baselines alone.
        "tune", str(conv_file), "--backend", "cpu", "--budget", "90s", "--out", str(out),
        "--registry", str(tmp_path / "registry.sqlite"), "--exact",
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "tune-report.json").read_text())
    assert report["exact"] is True
    (bucket,) = report["buckets"]
    assert bucket["bucket"] == "shape-2x3x16x16"  # the example input's shape, not a traffic bucket
    board = Board(out / "board.sqlite")
    try:
        done = [(c, r) for c in board.candidates() for r in board.results() if r.candidate == c.id]
    finally:
        board.close()
    tried = [(c, r) for c, r in done if c.agent != "baseline"]
    assert tried, "the tune tried no candidate beside the stock kernels"
    model = load_pt2(str(conv_file))
    seed = int(np.random.default_rng().integers(2**31))
    for c, r in done:
        group = c.group.split("@", 1)[0]
        if r.ok:
            assert r.gates[EXACT]["verdict"] == "pass", (group, c.config)
            assert _bitwise_to_stock(model, group, c.config, seed), f"{group} {c.config}: seed {seed}"
        elif r.gates.get(EXACT, {}).get("verdict") == "fail":
            assert r.cause.startswith(f"{EXACT}: not bit-exact"), r.cause  # rejected with its cause


def test_tune_refuses_llm_buckets_for_a_program(conv_file: Path, tmp_path: Path, capsys: Any) -> None:
    code = main(["tune", str(conv_file), "--ctx", "1024", "--out", str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert code == 2 and "example inputs' shapes" in err, err


def test_verify_exact(conv_file: Path, capsys: Any) -> None:
    assert main(["verify", str(conv_file), "--exact", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "deterministic, bit for bit" in out, out
    assert "DIFFER" not in out and "MISMATCH" not in out, out
