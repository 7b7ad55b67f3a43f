"""Integer inputs of an imported program's groups (the message-passing GNN of zoo.py): the gates draw
them from the range they can legally take (polymorph/ir/int_ranges.py: [0, n) for an index into a
dim of n, else the example inputs' range), so the index_select, scatter_add and index_add groups get
real group gates. The stock kernel passes them; a kernel that mishandles one index value (the last
row, or index 0) is rejected by the numerics gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from polymorph.engine.controller import Controller
from polymorph.engine.gates import NUMERICS
from polymorph.frontend import load_pt2
from polymorph.ir.int_ranges import legal_ranges

HERE = Path(__file__).parent / "kernels"


@pytest.fixture(scope="module")
def gnn_file(zoo: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(3)
    module, example = zoo.gnn()
    path = tmp_path_factory.mktemp("pt2") / "gnn.pt2"
    torch.export.save(torch.export.export(module, example, strict=False), str(path))
    return path


@pytest.fixture(scope="module")
def engine(gnn_file: Path) -> Any:
    with Controller.start(str(gnn_file), "cpu") as e:
        yield e


def _group(engine: Any, op: str) -> dict[str, Any]:
    return next(g for g in engine.loaded["groups"] if g["pattern"] == op)


def test_index_values_are_bounded_by_the_dim_they_index(gnn_file: Path) -> None:
    model = load_pt2(str(gnn_file))
    nodes = int(model.graph.inputs["x"].shape[0])
    ranges = legal_ranges(model.graph)
    assert ranges["edges"] == (0, nodes)  # sliced into rows that index_select and scatter_add use
    edges = model.example_inputs(seed=int(np.random.default_rng().integers(2**31)))["edges"]
    assert edges.min() >= 0 and edges.max() < nodes


@pytest.mark.parametrize("op", ["index_select", "scatter_add", "index_add"])
def test_stock_kernel_passes_the_group_gates(engine: Any, op: str) -> None:
    assert engine.program
    group = _group(engine, op)
    _, report = engine.try_candidate(group["id"], f"kernels/{group['kernel']}", {})  # its stock kernel
    assert report is not None and report.ok, [(g.name, g.verdict, g.cause) for g in report.gates]
    assert report.gate(NUMERICS).verdict == "pass"


@pytest.mark.parametrize(
    ("op", "kernel"),
    [("index_select", "index_select_short.py"), ("scatter_add", "scatter_add_drops_zero.py")],
)
def test_a_kernel_that_mishandles_an_index_is_rejected(engine: Any, op: str, kernel: str) -> None:
    _, report = engine.try_candidate(_group(engine, op)["id"], str(HERE / kernel), {})
    assert report is not None and not report.ok
    gate = report.gate(NUMERICS)
    assert gate.verdict == "fail" and "cannot judge" not in gate.cause, gate.cause


def test_index_ranges_follow_a_dynamic_node_count(zoo: Any) -> None:
    """The GNN with dynamic node and edge counts: at each bucket the edge indices are bounded by that
    bucket's node count, and the cpu plan matches eager on fresh inputs drawn within it."""
    from polymorph.frontend import from_torch
    from polymorph.frontend.tensors import run_on
    from polymorph.ir.dtypes import DType
    from polymorph.verify.tolerance import compare, model_tolerance

    torch.manual_seed(3)
    module, example = zoo.gnn()
    nodes, edges = torch.export.Dim("nodes", min=4, max=32), torch.export.Dim("edges", min=2, max=96)
    model = from_torch(module, example, dynamic_shapes=({0: nodes}, {1: edges}))
    seed = int(np.random.default_rng().integers(2**31))
    for sizes in model.bucket_sizes():
        at = model.at_sizes(sizes)
        n = at.input_shapes()["x"][0]
        assert legal_ranges(at.graph)["edges"] == (0, n)
        inputs = at.example_inputs(seed)
        want = at.run_program(inputs)["output_0"]
        c = compare(run_on(at, inputs, "cpu")["output_0"], want, model_tolerance(DType.F32))
        assert c.ok, f"{at.input_shapes()}: {c} (seed {seed})"
