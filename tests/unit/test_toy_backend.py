"""A backend from outside the tree, installed the way pip installs one, without changing this process.

tests/unit/toychip/ is a third party's backend package (`toy-chip`, on kernels/torch/) and its chip's
profile (toy1.toml). The test lays them out in a temporary folder as an installed distribution would
be (the package, and `toychip-0.1.dist-info/` with METADATA and an entry_points.txt naming it in the
group `polymorph.backends`), puts that folder on PYTHONPATH and the profile's folder in
POLYMORPH_PROFILES of subprocesses only, and drives the CLI there: `polymorph backends` lists it,
`compile llama-tiny --backend toy-chip` plans onto kernels/torch/ with only the fusion it opts into,
the compiled directory runs tokens the numpy reference agrees with, `verify` passes, the engine refuses
it by its Feature flags, and conformance holds it to its own pattern, not the cpu backend's.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from polymorph.models import load_model
from polymorph.pipeline.backend import ENTRY_POINT_GROUP, registry
from polymorph.serving.session import ReferenceExecutable, Session

TOYCHIP = Path(__file__).resolve().parent / "toychip"
REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600  # a loaded 2-core machine: generous


@pytest.fixture
def toy_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a subprocess that has toychip installed (and of no other process)."""
    site = tmp_path / "site"
    (site / "toychip").mkdir(parents=True)
    shutil.copy(TOYCHIP / "__init__.py", site / "toychip" / "__init__.py")
    dist = site / "toychip-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toychip\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ntoy-chip = toychip:ToyChipBackend\n")
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    shutil.copy(TOYCHIP / "toy1.toml", profiles / "toy1.toml")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    env["POLYMORPH_PROFILES"] = str(profiles)
    return env


def polymorph(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polymorph", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_this_process_does_not_have_it() -> None:
    assert "toy-chip" not in registry.names()
    assert importlib.util.find_spec("toychip") is None
    assert not [
        ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == "toy-chip"
    ]


@pytest.mark.slow
def test_toy_backend_compiles_runs_and_verifies_llama_tiny(toy_env: dict[str, str], tmp_path: Path) -> None:
    listed = polymorph(toy_env, tmp_path, "backends")
    assert listed.returncode == 0, listed.stderr
    (row,) = [line.split("\t") for line in listed.stdout.splitlines() if line.startswith("toy-chip\t")]
    assert row[1:4] == ["toy1", "yes", "yes"], row  # chips, compile, run

    out = tmp_path / "out"
    compiled = polymorph(
        toy_env, tmp_path, "compile", "llama-tiny", "--backend", "toy-chip", "--out", str(out)
    )
    assert compiled.returncode == 0, compiled.stderr
    plan = json.loads((out / "plan.json").read_text())
    assert (plan["backend"], plan["profile"], plan["target"]) == ("toy-chip", "toy1", "cpu")
    groups = plan["groups"]
    kernels = {g["kernel"]["file"] for g in groups}
    assert kernels and all(k.startswith("torch/") for k in kernels), kernels
    patterns = {g["pattern"] for g in groups}
    assert "linear+residual" in patterns  # the one fusion it opts into ...
    assert "linear+silu*mul" not in patterns  # ... and not the cpu backend's other one
    model = load_model("llama-tiny")
    assert {n for g in groups for n in g["nodes"]} == {n.name for n in model.graph.nodes}
    report = json.loads((out / "report.json").read_text())
    assert report["artifacts"] and all((out / f).is_file() for f in report["artifacts"])

    # The compiled directory runs; every token is the reference's greedy pick (within verify's
    # tolerance of a near tie), the reference fed the same tokens.
    prompt = [int(t) for t in np.random.default_rng().integers(0, 256, size=5)]
    ran = polymorph(
        toy_env, tmp_path, "run", str(out), "--prompt", " ".join(map(str, prompt)), "--new-tokens", "4"
    )
    assert ran.returncode == 0, ran.stderr
    (tokens_line,) = [line for line in ran.stdout.splitlines() if line.startswith("tokens:")]
    tokens = [int(t) for t in tokens_line.split()[1:]]
    assert len(tokens) == 4
    session = Session(ReferenceExecutable(model.graph, model.weights()), model.graph, batch=1, max_ctx=9)
    logits = session.step([0], np.array([prompt]))[0, -1]
    for token in tokens:
        best = float(logits.max())
        assert logits[token] >= best - 1e-3 * max(1.0, abs(best)), (
            prompt,
            tokens,
            token,
            int(logits.argmax()),
        )
        logits = session.step([0], np.array([[token]]))[0, -1]

    verified = polymorph(toy_env, tmp_path, "verify", "llama-tiny", "--backend", "toy-chip")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "logits match the reference at every step" in verified.stdout


def test_the_engine_reads_its_features(toy_env: dict[str, str], tmp_path: Path) -> None:
    """toy-chip declares no Feature.ENGINE: the engine refuses it and names the backends that have it."""
    check = (
        "from polymorph.engine.worker import require_engine\n"
        "from polymorph.errors import UserError\n"
        "require_engine('cpu')\n"
        "try:\n    require_engine('toy-chip')\nexcept UserError as e:\n    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", check], env=toy_env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "not `toy-chip`, which does not declare it" in done.stdout
    assert "Feature.ENGINE: cpu" in done.stdout and "toy-chip," not in done.stdout


@pytest.mark.slow
def test_conformance_holds_it_to_its_own_patterns(toy_env: dict[str, str], tmp_path: Path) -> None:
    """A backend that opts into fewer fusions than the cpu backend passes the entries of the one it
    declares (the MLP needs only its residual fusion), and the entries of the other skip with the reason."""
    xml = tmp_path / "conformance.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(REPO / "tests" / "conformance" / "test_ops.py"), "-q",
         "-p", "no:cacheprovider", "--junitxml", str(xml),
         "-k", "toy-chip and f32 and (mlp or silu or linear+residual or rmsnorm)"],
        env=toy_env, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    outcome = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        skipped = case.find("skipped")
        failed = case.find("failure") is not None or case.find("error") is not None
        outcome[case.get("name")] = "failed" if failed else ("skipped: " + skipped.get("message", "")
                                                            if skipped is not None else "passed")  # fmt: skip
    for name in ("test_fused[mlp-f32-toy-chip]", "test_fused[linear+residual-f32-toy-chip]",
                 "test_op[rmsnorm-f32-toy-chip]", "test_op[silu-f32-toy-chip]"):  # fmt: skip
        assert outcome.get(name) == "passed", (name, outcome)
    for name in (
        "test_fused[linear+silu*mul-f32-toy-chip]",
        "test_fused[linear+silu*mul.up_first-f32-toy-chip]",
    ):
        assert (
            outcome.get(name, "").startswith("skipped: ")
            and "opts into none of linear+silu*mul" in outcome[name]
        )
