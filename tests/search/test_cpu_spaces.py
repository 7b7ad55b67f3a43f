"""The cpu kernels' search spaces are real and the loop runs through them: every kernel llama-tiny's
plan uses on cpu declares choices beyond its default (or another library file takes its pattern), and
a short cpu tune of llama-tiny posts candidates from those spaces, gates them and measures the ones
that pass. Nothing here asserts a time (a loaded 2-core machine decides those): only that candidates
were accepted and measured."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polymorph import api
from polymorph.hardware.profile import load_profile
from polymorph.search.board import Board
from polymorph.search.space import group_spaces, predicted_times
from polymorph.search.tune import TuneOptions, tune

# The op signatures whose kernels gained choices for this issue; the rest (elementwise, layout,
# embedding) have nothing worth choosing at a decode step and stay fixed.
TUNABLE_PATTERNS = {
    "cache_attention", "rmsnorm", "kv_write", "linear", "linear+residual", "linear+silu*mul", "rope"
}  # fmt: skip


def test_llama_tiny_on_cpu_has_choices_in_every_tunable_pattern() -> None:
    artifact = api.compile("llama-tiny", "cpu", batch=1, ctx=1024)
    spaces = group_spaces(artifact.plan, "torch", predicted_times(artifact.report))
    by_pattern: dict[str, int] = {}
    for space in spaces.spaces:
        choices = len(space.configs) + sum(len(c) for _, c in space.alternatives)
        by_pattern[space.pattern] = max(by_pattern.get(space.pattern, 0), choices)
        assert dict(space.configs[0]) == dict(space.stock_config), f"{space.group}: stock is the first config"
    missing = TUNABLE_PATTERNS - {p for p, n in by_pattern.items() if n > 1}
    assert not missing, f"no choices for {sorted(missing)} (spaces: {by_pattern})"


@pytest.mark.slow
def test_a_short_cpu_tune_accepts_and_measures_candidates_from_the_new_spaces(tmp_path: Path) -> None:
    out = tmp_path / "run"
    uncalibrated = load_profile("cpu").calibration is None
    # A generous budget: engine start and the final A/B included, on a machine other jobs load.
    report = tune(
        TuneOptions(model="llama-tiny", backend="cpu", budget_s=120, workers=1, out=out,
                    registry=tmp_path / "registry.sqlite", trials=3, ab_trials=2, quiet=True)
    )  # fmt: skip
    (bucket,) = report.buckets
    board = Board(out / "board.sqlite")
    try:
        done = [c for c in board.candidates("done") if c.result is not None]
    finally:
        board.close()
    searched = [c for c in done if c.agent not in ("baseline", "registry")]
    assert searched, f"no agent's candidate was measured ({len(done)} done, stopped: {bucket.stopped})"
    passed = [c for c in searched if c.result.ok]
    assert passed, f"every searched candidate failed: {[c.result.cause for c in searched]}"
    for c in passed:
        assert c.result.measurements.get("median_s", 0) > 0, f"candidate {c.id} passed unmeasured"
    # At least one passed candidate is a choice these spaces added, not the stock config of its kernel.
    new_keys = {"read", "gqa", "epilogue", "index", "impl", "threads"}
    assert any(set(c.config) & new_keys for c in passed), [c.config for c in passed]
    ab = bucket.ab
    assert ab.get("gate") == "passed" and len(ab["stock_s"]) == len(ab["tuned_s"]) >= 2
    if uncalibrated:  # the run calibrated this host first, and its report predicts from that
        assert (out / "calibration" / "cpu.toml").is_file()
        kernels = json.loads((out / "report.json").read_text())["kernels"]
        assert all(k["predicted_s"] and k["predicted_s"] > 0 for k in kernels), kernels[0]


def test_a_champion_of_another_kernel_library_is_another_toolchain(tmp_path: Path, monkeypatch) -> None:
    """The registry key's toolchain names the kernel library the search ran over: a library with a new
    choice makes the old champions warm starts of another toolchain, not the last word on the bucket."""
    from polymorph.search import space as space_module

    before = space_module.toolchain("cpu")
    assert before.startswith("cpu: torch ") and f"kernels {space_module.library_hash('torch')}" in before
    library = tmp_path / "kernels"
    shutil.copytree(space_module.kernels_root() / "torch", library / "torch")
    monkeypatch.setattr(space_module, "kernels_root", lambda: library)
    assert space_module.toolchain("cpu") == before  # the same files: the same toolchain
    norm = library / "torch" / "norm.py"
    norm.write_text(norm.read_text() + "\n# one more line\n")
    assert space_module.toolchain("cpu") != before
