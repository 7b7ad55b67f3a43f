"""The champion registry: keys from a real plan, offers, bundles between two registry files."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from polymorph.errors import UserError
from polymorph.hardware.profile import load_profile
from polymorph.models import load_model
from polymorph.passes import bucket_bindings
from polymorph.pipeline.backend import registry as backends
from polymorph.pipeline.kernel_files import source_hash
from polymorph.search.board import Board
from polymorph.search.registry import (
    BUNDLE_SCHEMA_VERSION,
    Champion,
    ChampionKey,
    Measurement,
    Registry,
    group_signatures,
    read_bundle,
    shape_bucket,
    shape_bucket_at,
)
from polymorph.serving.traffic import TrafficShape
from polymorph.verify.tolerance import Tolerance

sys.path.insert(0, str(Path(__file__).parent))  # spawned children import board_processes by name
import board_processes
from board_processes import SPAWN

KERNEL = "IMPLEMENTS = 'rmsnorm'\nCONFIGS = [{'block': 128}]\n"
RMSNORM = "rmsnorm(f32[batch,seq,64],f32[64])->(f32[batch,seq,64])"
KEY = ChampionKey(RMSNORM, "b8-ctx512-1024", "cpu", "torch 2.11")


def champion(median_s: float, key: ChampionKey = KEY, source: str = KERNEL, **kw) -> Champion:
    fields = dict(
        key=key,
        source=source,
        config={"block": 128},
        measurement=Measurement(median_s, median_s / 50, 20),
        gates=("numerics", "kv-isolation"),
        tolerance=Tolerance(1e-4, 1e-5),
        reasoning="one program per row keeps the row in registers",
        agent="rmsnorm-agent",
        kernel="torch/rmsnorm.py",
        created=1.8e9,
    )
    fields.update(kw)
    return Champion(**fields)


def assert_one_line(e: pytest.ExceptionInfo[UserError], *needles: str) -> None:
    text = str(e.value)
    assert "\n" not in text and text
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text!r}"


# --- the key -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_plans():
    """llama-tiny lowered for cpu at two buckets, and in bf16."""
    cpu, profile = backends.get("cpu"), load_profile("cpu")
    f32, bf16 = load_model("llama-tiny").graph, load_model("llama-tiny", dtype="bf16").graph
    return (
        cpu.lower(f32, profile, bucket_bindings(f32, batch=1, ctx=64)),
        cpu.lower(f32, profile, bucket_bindings(f32, batch=8, ctx=1024)),
        cpu.lower(bf16, profile, bucket_bindings(bf16, batch=1, ctx=64)),
    )


def test_op_signature_is_pattern_dtypes_and_dims(llama_plans) -> None:
    small, large, bf16 = llama_plans
    sigs = group_signatures(small)
    assert set(sigs) == {g.id for g in small.groups}
    assert sigs["layers.0.attn.norm"] == RMSNORM
    # The model's own dims are numbers, the bucket's dims are names: every layer shares a signature,
    assert sigs["layers.1.attn.norm"] == sigs["layers.0.attn.norm"]
    assert sigs["layers.0.attn.k"] == sigs["layers.1.attn.k"] != sigs["layers.0.attn.q"]
    assert sigs["layers.0.attn.k"] == "linear(f32[batch,seq,64],f32[32,64])->(f32[batch,seq,32])"
    # and every bucket (the bucket is the key's next part); the dtype is in it.
    assert group_signatures(large) == sigs
    assert group_signatures(bf16)["layers.0.attn.norm"] == RMSNORM.replace("f32", "bf16")


def test_shape_bucket_is_the_traffic_bucket_id() -> None:
    (bucket,) = TrafficShape.single(8, 1024).buckets()
    assert shape_bucket(bucket) == shape_bucket_at(8, 1024) == bucket.id == "b8-ctx512-1024"
    assert shape_bucket(bucket, seq=16) == "b8-ctx512-1024-seq16"
    assert ChampionKey(RMSNORM, shape_bucket(bucket, seq=16), "h200", "triton 3.6.0").bucket.endswith("seq16")
    with pytest.raises(UserError) as e:
        shape_bucket(bucket, seq=0)
    assert_one_line(e, "seq")


@pytest.mark.parametrize(
    "fields, needles",
    [
        (dict(bucket="b8-ctx2048-1024"), ("b8-ctx2048-1024", "lo < hi")),
        (dict(bucket="batch8"), ("not a traffic bucket id",)),
        (dict(profile="h9000"), ("unknown chip `h9000`", "h200")),
        (dict(toolchain=" "), ("toolchain",)),
    ],
)
def test_bad_keys_are_one_line(fields: dict, needles: tuple[str, ...]) -> None:
    with pytest.raises(UserError) as e:
        replace(KEY, **fields)
    assert_one_line(e, *needles)


def test_key_ids_are_stable_and_distinct() -> None:
    assert KEY.id == ChampionKey(*[KEY.op_signature, KEY.bucket, KEY.profile, KEY.toolchain]).id
    assert len(KEY.id) == 12
    assert len({KEY.id, replace(KEY, toolchain="torch 2.12").id, replace(KEY, profile="h200").id}) == 3


# --- offers ------------------------------------------------------------------------------------------


def test_a_slower_candidate_does_not_replace_the_champion(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "registry.sqlite")
    assert reg.best(KEY) is None
    first = reg.offer(champion(2e-5))
    assert (first.kept, first.previous_s, first.speedup) == (True, None, None)

    slower = reg.offer(champion(3e-5, source=KERNEL + "# slower\n", reasoning="more warps"))
    assert (slower.kept, slower.previous_s) == (False, 2e-5)
    assert slower.speedup == pytest.approx(2 / 3)
    assert "not kept" in slower.describe() and "-50.0%" in slower.describe()
    tie = reg.offer(champion(2e-5, source=KERNEL + "# same speed\n"))
    assert not tie.kept
    best = reg.best(KEY)
    assert best is not None and best.source == KERNEL and best.measurement.median_s == 2e-5

    faster = reg.offer(champion(1e-5, source=KERNEL + "# faster\n", config={"block": 256}))
    assert (faster.kept, faster.previous_s, faster.speedup) == (True, 2e-5, pytest.approx(2.0))
    assert "kept: faster" in faster.describe() and "+50.0%" in faster.describe()
    best = reg.best(KEY)
    assert best == champion(1e-5, source=KERNEL + "# faster\n", config={"block": 256})
    assert best.sha256 == source_hash((KERNEL + "# faster\n").encode())
    assert reg.list() == [best]
    assert reg.find(KEY.id[:6]) == best


def test_other_keys_keep_their_own_champions(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "registry.sqlite")
    keys = [KEY, replace(KEY, bucket="b1-ctx32-64"), replace(KEY, profile="h200", toolchain="triton 3.6.0")]
    for median, key in zip([1e-5, 2e-5, 3e-5], keys):
        assert reg.offer(champion(median, key=key)).kept
    assert [reg.best(k).measurement.median_s for k in keys] == [1e-5, 2e-5, 3e-5]
    assert len(reg.list()) == 3


def test_related_champions_are_other_keys_of_the_signature_on_buildable_chips(tmp_path: Path) -> None:
    """Warm starts for a key with no champion: the same op signature elsewhere, nearest first (same
    chip, then same bucket, then fastest), only on the chips the caller can build for."""
    reg = Registry(tmp_path / "r.sqlite")
    other_toolchain = replace(KEY, toolchain="torch 2.13")
    other_bucket = replace(KEY, bucket="b1-ctx512-1024")
    other_chip = replace(KEY, profile="h200")
    for key, median in ((other_chip, 1e-6), (other_bucket, 3e-5), (other_toolchain, 5e-5), (KEY, 4e-5)):
        reg.offer(champion(median, key))
    reg.offer(
        champion(1e-6, replace(KEY, op_signature="rmsnorm(f32[batch,seq,32],f32[32])->(f32[batch,seq,32])"))
    )
    assert [c.key for c in reg.related(KEY, ["cpu"])] == [other_toolchain, other_bucket]
    assert [c.key for c in reg.related(KEY, ["cpu", "h200"])] == [other_toolchain, other_bucket, other_chip]
    assert reg.related(KEY, ["mi355x"]) == []
    reg.close()


def test_offers_from_two_processes_keep_the_fastest(tmp_path: Path) -> None:
    path = tmp_path / "registry.sqlite"
    Registry(path).offer(champion(1.0))
    medians = [[0.9, 0.5, 0.7, 0.3, 0.8], [0.6, 0.4, 0.35, 0.95, 0.31]]
    procs = [SPAWN.Process(target=board_processes.offer_many, args=(path, KEY, KERNEL, m)) for m in medians]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    best = Registry(path).best(KEY)
    assert best is not None and best.measurement.median_s == 0.3 and best.source == f"{KERNEL}# 0.3\n"


def test_board_and_registry_share_one_file(tmp_path: Path) -> None:
    path = tmp_path / "search.sqlite"
    board, reg = Board(path), Registry(path)
    cid = board.post(group="layers.0.attn.norm", backend="cpu", target="cpu", source=KERNEL + "# board\n")
    reg.offer(champion(1e-5))
    assert board.show(cid).source == KERNEL + "# board\n"
    assert reg.best(KEY).source == KERNEL


# --- bundles -----------------------------------------------------------------------------------------


def test_a_bundle_round_trips_between_two_registries(tmp_path: Path) -> None:
    a, b = Registry(tmp_path / "a.sqlite"), Registry(tmp_path / "b.sqlite")
    k2, k3 = (
        replace(KEY, bucket="b1-ctx32-64"),
        replace(KEY, profile="mi355x", toolchain="triton 3.6.0, rocm 7"),
    )
    a.offer(champion(1e-5, source=KERNEL + "# a1\n"))
    a.offer(champion(5e-5, key=k2, source=KERNEL + "# a2\n"))
    b.offer(champion(2e-5, source=KERNEL + "# b1\n"))  # slower than a's: replaced
    b.offer(champion(4e-5, key=k2, source=KERNEL + "# b2\n"))  # faster than a's: kept
    b.offer(champion(7e-5, key=k3, source=KERNEL + "# b3\n"))  # only b has it

    assert a.export_bundle(tmp_path / "a.json") == 2
    summary = b.import_bundle(tmp_path / "a.json")
    assert (summary.added, summary.replaced, summary.kept) == (0, 1, 1)
    assert b.best(KEY) == a.best(KEY)
    assert b.best(KEY).source == KERNEL + "# a1\n"
    assert b.best(k2).source == KERNEL + "# b2\n"
    assert b.best(k3).source == KERNEL + "# b3\n"

    # Into an empty registry, a bundle gives back exactly what was exported, sources included.
    b.export_bundle(tmp_path / "b.json")
    c = Registry(tmp_path / "c.sqlite")
    summary = c.import_bundle(tmp_path / "b.json")
    assert (summary.added, summary.replaced, summary.kept) == (3, 0, 0)
    assert c.list() == b.list()
    bundle = json.loads((tmp_path / "b.json").read_text())
    assert bundle["schema_version"] == BUNDLE_SCHEMA_VERSION
    assert set(bundle["sources"]) == {ch.sha256 for ch in b.list()}
    # Importing again changes nothing.
    again = c.import_bundle(tmp_path / "b.json")
    assert (again.added, again.replaced, again.kept) == (0, 0, 3)
    assert c.list() == b.list()


def _corrupt(bundle: dict, how: str) -> str | dict:
    if how == "not json":
        return '{"format": "polymorph-registry-bundle", "champions": [\n'
    if how == "schema":
        bundle["schema_version"] = BUNDLE_SCHEMA_VERSION + 1
    elif how == "format":
        bundle.pop("format")
    elif how == "source":
        sha = next(iter(bundle["sources"]))
        bundle["sources"][sha] += "# tampered\n"
    elif how == "missing field":
        del bundle["champions"][1]["median_s"]
    elif how == "bad median":
        bundle["champions"][1]["median_s"] = -1.0
    elif how == "missing source":
        bundle["champions"][1]["sha256"] = "0" * 64
    return bundle


@pytest.mark.parametrize(
    "how, needles",
    [
        ("not json", ("not valid JSON", "line 2")),
        ("schema", (f"schema_version {BUNDLE_SCHEMA_VERSION + 1}", f"reads {BUNDLE_SCHEMA_VERSION}")),
        ("format", ("not a polymorph registry bundle",)),
        ("source", ("does not match its sha256", "corrupt")),
        ("missing field", ("champion 1", "median_s")),
        ("bad median", ("champion 1", "median_s", "> 0")),
        ("missing source", ("champion 1", "not in the bundle's sources")),
    ],
)
def test_a_corrupt_bundle_is_one_line_and_changes_nothing(tmp_path: Path, how: str, needles: tuple) -> None:
    a = Registry(tmp_path / "a.sqlite")
    a.offer(champion(1e-5))
    a.offer(champion(1e-5, key=replace(KEY, bucket="b1-ctx32-64"), source=KERNEL + "# 2\n"))
    a.export_bundle(tmp_path / "a.json")
    bad = _corrupt(json.loads((tmp_path / "a.json").read_text()), how)
    path = tmp_path / "bad.json"
    path.write_text(bad if isinstance(bad, str) else json.dumps(bad))
    b = Registry(tmp_path / "b.sqlite")
    b.offer(champion(9e-5))
    with pytest.raises(UserError) as e:
        b.import_bundle(path)
    assert_one_line(e, str(path), *needles)
    assert [ch.measurement.median_s for ch in b.list()] == [9e-5]


def test_reading_a_missing_bundle_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError) as e:
        read_bundle(tmp_path / "nowhere.json")
    assert_one_line(e, "cannot read the bundle", "nowhere.json")


@pytest.mark.parametrize(
    "fields, needles",
    [
        (dict(gates=()), ("gates it passed",)),
        (dict(source=""), ("kernel source is empty",)),
        (dict(config={"x": float("nan")}), ("config is not plain JSON",)),
        (dict(tolerance=Tolerance(-1.0, 0.0)), ("rtol",)),
    ],
)
def test_bad_champions_are_one_line(fields: dict, needles: tuple[str, ...]) -> None:
    with pytest.raises(UserError) as e:
        champion(1e-5, **fields)
    assert_one_line(e, *needles)
    with pytest.raises(UserError) as e:
        Measurement(1e-5, 0.0, 0)
    assert_one_line(e, "trials")


def test_unknown_key_id_is_one_line(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "registry.sqlite")
    reg.offer(champion(1e-5))
    with pytest.raises(UserError) as e:
        reg.find("abcdef012345" if not KEY.id.startswith("abcd") else "012345abcdef")
    assert_one_line(e, "no champion with key id")
    with pytest.raises(UserError) as e:
        reg.find("zz")
    assert_one_line(e, "hex digits")


def test_a_champion_carries_the_shared_modules_its_source_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from polymorph.pipeline import kernel_files

    source = (kernel_files.kernels_root() / "triton" / "linear_residual.py").read_text()
    shared = {sha: text for _, sha, text in kernel_files.pinned_sources(source)}
    carried = sorted((name, sha) for name, sha, _ in kernel_files.pinned_sources(source))
    assert shared
    a = Registry(tmp_path / "a.sqlite")
    a.offer(champion(2e-5, source=source, shared=shared))
    assert a.list()[0].shared == shared
    a.export_bundle(tmp_path / "bundle.json")
    b = Registry(tmp_path / "b.sqlite")
    b.import_bundle(tmp_path / "bundle.json")
    (got,) = b.list()
    assert got.shared == shared and got.source == source
    # On a machine whose library has moved on, the champion loads from what it carries (tune writes the
    # shared modules beside the champion's file, where kernel_files.depend looks first).
    folder = tmp_path / "sources"
    path = kernel_files.store_source(folder, got.source)
    for text in got.shared.values():
        kernel_files.store_source(folder, text)
    moved = tmp_path / "other-library"
    (moved / "triton").mkdir(parents=True)
    (moved / "triton" / "_projection.py").write_text("# another version\n")
    monkeypatch.setattr(kernel_files, "kernels_root", lambda: moved)
    assert kernel_files.load_kernel(path).depends == tuple(carried)
    # The projection core and every module it pins (the interpreter's corrections, the per-target
    # config chooser, ...), each carried once.
    assert {"triton/_projection.py", "triton/_interpreter.py"} <= {name for name, _ in carried}
    assert len(got.shared) == len(carried)
    # ... and a tuned plan naming it compiles to an output that carries what it runs.
    from types import SimpleNamespace

    choice = SimpleNamespace(file=str(path), sha256=kernel_files.source_hash(path.read_bytes()))
    out = tmp_path / "compiled"
    written = kernel_files.copy_kernel_sources(SimpleNamespace(groups=[SimpleNamespace(kernel=choice)]), out)
    assert {f"kernels/{sha}.py" for sha in got.shared} <= set(written)
    assert kernel_files.load_choice(str(path), choice.sha256, out).depends == tuple(carried)
