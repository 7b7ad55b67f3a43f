"""`polymorph demo` end to end, as a user runs it (a subprocess in an empty folder): every step prints,
and its short tune ran on the demo's engine and gated and timed real candidates, shown in its speedup
table. Content only: the demo's wall time is measured by hand (README), never asserted here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 900  # the whole demo on a loaded 2-core machine, with room


def test_the_demo_runs_and_its_tune_measures_candidates(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYMORPH_")}
    env["POLYMORPH_PLAIN"] = "1"
    # 30 s rather than the default 15 s: a candidate's gates can take several seconds on a busy machine
    r = subprocess.run([sys.executable, "-m", "polymorph", "demo", "--budget", "30s"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr
    out = r.stdout
    assert "seeded random weights" in out and "repeat" in out
    for step in ("\n1. the graph:", "\n2. compiled for cpu:", "# 3. verify:", "\n4. the same graph",
                 "\n5. hot swap of", "\n6. a short tune: polymorph tune llama-tiny --backend cpu --budget 30s"):  # fmt: skip
        assert step in out, step
    assert "\tregisters\tspills\tshared/LDS\toccupancy\t" in out  # a per-kernel resource table
    gates = re.findall(r"^([a-z_.]+)\t(pass|fail|not run)\t", out, re.M)
    assert ("numerics", "pass") in gates and all(v == "pass" for _, v in gates), gates

    demo = tmp_path / "polymorph-demo"
    (bucket,) = json.loads((demo / "tune" / "tune-report.json").read_text())["buckets"]
    assert bucket["candidates"] >= 1 and bucket["passed"] >= 1, bucket
    # The tune's one worker was a thread on the demo's engine: no worker process, no log of one.
    assert bucket["workers_started"] == 1 and not (demo / "tune" / "logs").exists()
    timed = [s for s in bucket["signatures"] if s["stock_s"] is not None]
    assert timed and all(s["stock_s"] > 0 and s["best"]["median_s"] > 0 for s in timed), timed
    assert all(s["best"]["gates"]["numerics"]["ok"] for s in timed)  # each passed its gates, then was timed
    # The speedup table, as printed: a timed row shows stock, best and their ratio.
    head = f"   # bucket {bucket['bucket']} (weight 1.00): {bucket['candidates']} candidates, "
    assert head in out, out
    rows = re.findall(r"^   \S[^\t]*\t\d+\t\d+%\t([^\t]+)\t([^\t]+)\t(\d+\.\d\dx)\t", out, re.M)
    assert len(rows) == len(timed), rows
    # No winner: the final A/B is skipped and says why; a winner: it ran its pairs on the same engine.
    ab = bucket["ab"]
    if ab.get("skipped"):
        assert "end to end: no final A/B: no candidate beat its stock kernel" in out
    else:
        assert ab["engine"] == "the search's" and ab["pairs"] >= 20 and "in the search's engine" in out
    assert (demo / "tune-output.txt").read_text().splitlines()[0].startswith("registry: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["polymorph-demo"]


def _one_winner(tmp_path: Path) -> tuple:
    """llama-tiny's spaces at the default bucket, with a copy of one stock kernel posing as a winner
    (it computes the same thing, from another file)."""
    from polymorph import api
    from polymorph.models import load_model
    from polymorph.search.space import buckets_of, group_spaces, predicted_times
    from polymorph.search.tune import SignatureResult

    (bucket,) = buckets_of(None, None, None)
    artifact = api.compile(load_model("llama-tiny"), "cpu", "cpu", batch=bucket.batch, ctx=bucket.ctx)
    spaces = group_spaces(artifact.plan, "torch", predicted_times(artifact.report)).spaces
    space = max(spaces, key=lambda s: len(s.groups))
    by_sig = {s.signature: SignatureResult(s.signature, list(s.groups), s.share) for s in spaces}
    copy = tmp_path / "champion.py"
    copy.write_text(space.stock_kernel.read_text() + "\n# the same kernel, another file: a winner to swap\n")
    by_sig[space.signature].stock_s = 1.0
    by_sig[space.signature].best = {"path": str(copy), "config": dict(space.stock_config), "median_s": 0.5}
    return bucket, spaces, space, by_sig


def test_no_winner_skips_the_final_ab_and_says_why(tmp_path: Path) -> None:
    from polymorph.search.tune import TuneOptions, _final_ab
    from polymorph.search.tune_view import ab_lines

    bucket, spaces, space, by_sig = _one_winner(tmp_path)
    by_sig[space.signature].best = None  # nothing beat stock
    ab = _final_ab(TuneOptions(model="llama-tiny", out=tmp_path), "cpu", bucket, spaces, by_sig, None)
    assert ab["pairs"] == 0 and ab["gate"] == "not run" and ab["same_plan"] and "engine_start_s" not in ab
    text = " ".join(ab_lines(ab))
    assert "no final A/B" in text and "no candidate beat its stock kernel by 2%" in text
    assert all(len(line) <= 80 for line in ab_lines(ab))
    assert not any(s.chosen for s in by_sig.values())


def test_the_final_ab_on_the_searchs_engine_hands_it_back_at_stock(tmp_path: Path) -> None:
    """TuneOptions.engine: the A/B runs its 20 pairs on the caller's engine (no engine of its own),
    and the engine stays open with stock kernels everywhere, its canary healthy."""
    from polymorph.engine.controller import Controller
    from polymorph.search.tune import TuneOptions, _final_ab, engine_fits

    bucket, spaces, space, by_sig = _one_winner(tmp_path)
    with Controller.start("llama-tiny", "cpu", batch=bucket.batch, ctx=bucket.ctx, dtype="f32") as engine:
        load = {"model": "llama-tiny", "backend": "cpu", "profile": "cpu", "batch": bucket.batch,
                "ctx": bucket.ctx, "dtype": "f32"}  # fmt: skip
        assert engine_fits(engine, load) and not engine_fits(engine, {**load, "batch": bucket.batch + 1})
        opts = TuneOptions(model="llama-tiny", dtype="f32", out=tmp_path, ab_trials=2, seed=3, engine=engine)
        ab = _final_ab(opts, "cpu", bucket, spaces, by_sig, None, engine=engine)
        assert ab["engine"] == "the search's" and ab["pairs"] == 20 and ab["gate"] == "passed"
        assert ab["swapped_groups"] == len(space.groups) and by_sig[space.signature].chosen
        assert not engine.accepted and not engine.pending
        assert not any(e["candidate"] for e in engine.status()["groups"].values())
        assert engine.healthy()
