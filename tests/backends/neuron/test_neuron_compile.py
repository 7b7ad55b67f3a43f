"""What `polymorph compile --backend neuron` writes, on any machine: the decode step's HLO (text and
proto) and StableHLO, the manifest, the report; the checker that keeps weights as parameters and
custom calls and host callbacks out; the content-hashed compile cache (with a stand-in neuronx-cc
that records its command line: the real compiler is not installed here)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from polymorph import api
from polymorph.cli import command as cli
from polymorph.errors import UserError
from polymorph.knobs import knobs
from polymorph.models import load_model
from polymorph.pipeline.backend import registry

jax = pytest.importorskip(
    "jax", reason="the neuron backend lowers through JAX: pip install 'polymorph[neuron]'"
)

from polymorph.backends.neuron import hlo, neuronxcc  # noqa: E402  (needs jax only when used)

pytestmark = pytest.mark.compile


@pytest.fixture
def no_neuronx_cc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """PATH without neuronx-cc (this interpreter's folder only), and a private compile cache."""
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    assert not neuronxcc.installed()
    with knobs.scope(cache_dir=tmp_path / "cache"):
        yield tmp_path


@pytest.fixture
def fake_neuronx_cc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A stand-in `neuronx-cc` on PATH that appends its argv to calls.jsonl and writes its --output."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.jsonl"
    script = bin_dir / "neuronx-cc"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        "if sys.argv[1:] == ['--version']:\n"
        "    print('NeuronX Compiler version 0.0-test'); sys.exit(0)\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "out = sys.argv[sys.argv.index('--output') + 1]\n"
        "open(out, 'wb').write(b'NEFF ' + open(sys.argv[2], 'rb').read()[:16])\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}")
    neuronxcc._version.cache_clear()
    with knobs.scope(cache_dir=tmp_path / "cache"):
        yield calls
    neuronxcc._version.cache_clear()


def _calls(path: Path) -> list[list[str]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_llama_3_2_1b_decode_step_hlo(no_neuronx_cc: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`polymorph compile llama-3.2-1b --backend neuron --target trn2 --out DIR` needs no weights and no
    Neuron toolchain: it writes the batch-1 decode step's modules, and says in one warning line that
    the NEFF is not built, exit 0. Weights are parameters: one per graph param, state tensor, input."""
    out = no_neuronx_cc / "llama-1b"
    code = cli.main(["compile", "llama-3.2-1b", "--backend", "neuron", "--target", "trn2", "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.strip()]
    assert warnings == [f"polymorph: warning: {neuronxcc.NEFF_NOT_BUILT}"], err
    for name in (
        "model.hlo.pb",
        "model.hlo.txt",
        "model.stablehlo.mlir",
        "manifest.json",
        "plan.json",
        "report.json",
    ):
        assert (out / name).is_file(), name
    assert not (out / "model.neff").exists()
    text = (out / "model.hlo.txt").read_text()
    assert text.startswith("HloModule ")
    assert "stablehlo." in (out / "model.stablehlo.mlir").read_text()
    assert (out / "model.hlo.pb").stat().st_size > 0

    graph = load_model("llama-3.2-1b", dtype="bf16").graph
    check = hlo.check_hlo(text)
    assert check.ok, check.faults
    assert not check.custom_calls
    assert len(check.parameters) == len(graph.params) + len(graph.inputs) + len(graph.state)
    assert check.largest_constant_bytes <= hlo.MAX_CONSTANT_BYTES

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["jax_version"] == jax.__version__
    assert manifest["bindings"]["batch"] == 1 and manifest["bindings"]["seq"] == 1
    params = manifest["parameters"]
    assert [p["index"] for p in params] == list(range(len(params)))
    assert [p["name"] for p in params] == [*graph.params, *graph.state, *graph.inputs]
    embed = params[0]
    assert embed["name"] == "model.embed_tokens.weight" and embed["shape"] == [128256, 2048]
    assert embed["dtype"] == "bf16" and embed["hlo_dtype"] == "bf16"
    assert manifest["checks"]["ok"] and manifest["checks"]["expected_parameters"] == len(params)
    assert manifest["neuronx_cc"]["command"] == [
        "neuronx-cc", "compile", "model.hlo.pb", "--framework", "XLA", "--target", "trn2",
        "--model-type", "transformer", "--auto-cast", "none", "--output", "model.neff",
    ]  # fmt: skip
    states = [r for r in manifest["results"] if r["kind"] == "state"]
    assert len(states) == len(graph.state) and all("donated_parameter" in r for r in states)
    assert "input_output_alias" in text  # the KV cache is updated in place

    report = json.loads((out / "report.json").read_text())
    assert report["predicted_step_s"] > 0
    assert "prediction, not a measurement" in report["prediction"] and "trn2.toml" in report["prediction"]
    assert report["warnings"] == [neuronxcc.NEFF_NOT_BUILT]
    resources = report["kernels"][0]["resources"]
    assert resources["hlo_instructions"] > 0 and resources["neff"].startswith("not built")
    assert {"sbuf_bytes_per_core", "fits_sbuf", "working_set_bytes"} <= set(resources)


def test_moe_tiny_hlo_is_written(no_neuronx_cc: Path) -> None:
    out = no_neuronx_cc / "moe"
    model = load_model("moe-tiny", dtype="bf16")
    artifact = api.compile(model, "neuron", "trn2", out)
    check = hlo.check_hlo((out / "model.hlo.txt").read_text())
    assert check.ok, check.faults
    graph = model.graph
    assert len(check.parameters) == len(graph.params) + len(graph.inputs) + len(graph.state)
    assert "model.hlo.pb" in artifact.files and "manifest.json" in artifact.files
    # The written directory loads and runs by itself (kernel sources travel with it).
    loaded = api.load_compiled(out)
    exe = api.load(loaded, model)
    exe.allocate_state(loaded.plan.bindings["cache_blocks"])
    logits = exe.run(
        {
            "tokens": np.array([[1]], np.int32),
            "positions": np.array([[0]], np.int32),
            "block_table": np.arange(loaded.plan.bindings["ctx_blocks"], dtype=np.int32)[None],
        }
    )["logits"]
    assert logits.shape == (1, 1, 256) and np.isfinite(logits).all()


def test_checker_refuses_custom_calls_callbacks_and_big_constants() -> None:
    import jax.numpy as jnp

    x = jax.ShapeDtypeStruct((4, 4), jnp.float32)

    def with_callback(a):
        return jax.pure_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(a.shape, a.dtype), a)

    check = hlo.check_hlo(hlo.lower(with_callback, [x]).hlo_text)
    assert not check.ok and "custom call" in check.faults[0]

    table = np.arange(1024, dtype=np.float32)  # a 4 KiB constant: a weight baked into the module
    check = hlo.check_hlo(
        hlo.lower(lambda a: a + table[:16].reshape(4, 4).sum() + jnp.asarray(table).sum(), [x]).hlo_text
    )
    assert not check.ok and "constant of 4096 bytes" in " ".join(check.faults)

    check = hlo.check_hlo(hlo.lower(lambda a, w: jnp.tanh(a @ w), [x, x]).hlo_text)
    assert check.ok and [p.shape for p in check.parameters] == [(4, 4), (4, 4)]

    allowed = 'ROOT c = f32[4]{0} custom-call(f32[4]{0} p), custom_call_target="AwsNeuronRmsNorm"'
    assert hlo.check_hlo(f"ENTRY e {{\n  p = f32[4]{{0}} parameter(0)\n  {allowed}\n}}\n").ok
    with pytest.raises(UserError, match="not fit for neuronx-cc"):
        hlo.require_ok(hlo.check_hlo("ENTRY e {\n  ROOT i = f32[4]{0} infeed(token)\n}\n"), "test")


def test_compile_cache_recompiles_only_the_changed_group(fake_neuronx_cc: Path, tmp_path: Path) -> None:
    """With neuronx-cc present, compile builds one NEFF per distinct group module and one for the
    step, with the documented command line; a second compile hits the cache; a changed group (the
    MoE experts' kernel config) recompiles alone, plus the step that contains it."""
    model = load_model("moe-tiny", dtype="bf16")
    backend = registry.get("neuron")
    artifact = api.compile(model, "neuron", "trn2", tmp_path / "a")
    assert not artifact.report.warnings
    first = _calls(fake_neuronx_cc)
    groups = {k.resources["hlo_cache_key"] for k in artifact.report.kernels}
    assert len(first) == len(groups) + 1  # every distinct group, and the step
    for argv in first:
        assert argv[0] == "compile" and argv[1] == "module.hlo.pb"
        assert argv[2:10] == [
            "--framework",
            "XLA",
            "--target",
            "trn2",
            "--model-type",
            "transformer",
            "--auto-cast",
            "none",
        ]
    assert (tmp_path / "a" / "model.neff").read_bytes().startswith(b"NEFF")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["neuronx_cc"]["version"] == "NeuronX Compiler version 0.0-test"
    cache_root = Path(manifest["cache"]["root"])
    assert cache_root == knobs.cache_dir / "neuron"
    for key in groups:
        entry = cache_root / key[:2] / key
        assert (entry / "module.hlo.pb").is_file() and (entry / "model.neff").is_file()
        assert json.loads((entry / "entry.json").read_text())["kind"] == "group"

    api.compile(model, "neuron", "trn2", tmp_path / "b")
    assert len(_calls(fake_neuronx_cc)) == len(first)  # all cached

    plan = artifact.plan
    moe = [g for g in plan.groups if g.pattern == "moe_ffn"]
    changed = [g if g.pattern != "moe_ffn" else _with_config(g, {"impl": "dense"}) for g in plan.groups]
    plan.groups = changed
    backend.compile(plan, tmp_path / "c")
    new = _calls(fake_neuronx_cc)[len(first) :]
    assert len(new) == 2, new  # the (one, shared by both layers) MoE group and the step
    assert len(moe) == 2


def _with_config(group, config):
    import dataclasses

    return dataclasses.replace(group, kernel=dataclasses.replace(group.kernel, config=config))


def test_a_symbolic_plan_is_refused_for_writing(no_neuronx_cc: Path) -> None:
    backend = registry.get("neuron")
    from polymorph.hardware.profile import load_profile

    plan = backend.lower(load_model("llama-tiny").graph, load_profile("trn2"))
    assert backend.compile(plan).report.predicted_step_s is None  # in memory: fine, nothing to predict
    with pytest.raises(UserError, match="needs concrete dims"):
        backend.compile(plan, no_neuronx_cc / "out")
