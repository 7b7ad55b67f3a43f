"""polymorph.hardware.profile: profile loading and validation, calibration overlay, roofline."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from polymorph.errors import UserError
from polymorph.hardware import profile as hw
from polymorph.hardware.target import Target
from polymorph.ir.dtypes import DType

PROFILES = {
    "h100": "cuda:sm_90",
    "h200": "cuda:sm_90",
    "b200": "cuda:sm_100",
    "gb300": "cuda:sm_103",
    "mi300x": "rocm:gfx942",
    "mi355x": "rocm:gfx950",
    "trn2": "neuron:trn2",
    "cpu": "cpu",
}
VENDOR = sorted(set(PROFILES) - {"cpu"})


@pytest.fixture
def no_calibration(tmp_path: Path) -> Path:
    """An empty calibration directory, so vendor figures are tested whatever measured/ holds."""
    empty = tmp_path / "no-calibration"
    empty.mkdir()
    return empty


def test_the_shipped_profiles_are_the_documented_ones() -> None:
    assert hw.list_profiles() == sorted(PROFILES)


def test_profiles_are_found_from_the_checkout() -> None:
    root = hw.profiles_dir()
    assert (root / "h200.toml").is_file()
    assert (root / "__init__.py").is_file()
    measured = hw.default_calibration_dir()
    assert measured is not None and (measured / "README.md").is_file()


@pytest.mark.parametrize("pid", sorted(PROFILES))
def test_every_profile_loads_and_validates(pid: str, no_calibration: Path) -> None:
    profile = hw.load_profile(pid, no_calibration)
    assert profile.id == pid
    assert profile.target == Target.parse(PROFILES[pid])
    assert profile.backend == profile.target.family
    assert profile.calibration is None
    # Loading with the default calibration directory validates whatever measured/ holds as well.
    assert hw.load_profile(pid).id == pid


@pytest.mark.parametrize("pid", VENDOR)
def test_vendor_profiles_carry_roofline_figures_with_sources(pid: str, no_calibration: Path) -> None:
    profile = hw.load_profile(pid, no_calibration)
    bandwidth = profile.memory_bandwidth()
    capacity = profile.memory_bytes()
    bf16 = profile.peak_flops("bf16")
    assert bandwidth is not None and 1e12 < bandwidth < 1e13
    assert capacity is not None and 50e9 < capacity < 400e9
    assert bf16 is not None and 5e14 < bf16 < 5e15
    fp8 = profile.peak_flops("fp8e4m3")
    assert fp8 is not None and fp8 > bf16
    assert profile.vendor, "a vendor profile has figures"
    for fig in profile.vendor:
        assert fig.source.strip(), fig.name
        assert fig.evidence in hw.EVIDENCE


def test_figures_match_the_reference_table(no_calibration: Path) -> None:
    h200 = hw.load_profile("h200", no_calibration)
    assert h200.memory_bandwidth() == pytest.approx(4.8e12)
    assert h200.memory_bytes() == 141_000_000_000
    assert h200.peak_flops("bf16") == pytest.approx(989e12)
    assert h200.compute_units() == 132
    mi355x = hw.load_profile("mi355x", no_calibration)
    assert mi355x.peak_flops("fp8e5m2") == pytest.approx(5000e12)
    assert mi355x.figure("shared_memory_per_unit").si == 160 * 1024  # LDS, binary KiB
    trn2 = hw.load_profile("trn2", no_calibration)
    assert trn2.memory_bytes() == 96 * 2**30
    assert trn2.figure("sbuf_per_unit").si == 28 * 2**20
    assert hw.load_profile("mi300x", no_calibration).figure("warp_size").si == 64


def test_conflicts_from_the_reference_are_flagged(no_calibration: Path) -> None:
    assert "60 MB" in (hw.load_profile("h200", no_calibration).figure("l2_cache").note or "")
    assert "10,000" in (hw.load_profile("b200", no_calibration).figure("peak.fp4").note or "")
    assert "3 TB/s" in (hw.load_profile("trn2", no_calibration).figure("memory_bandwidth").note or "")
    assert "TF32" in (hw.load_profile("mi355x", no_calibration).note or "")


def test_cpu_profile_has_no_vendor_figures(no_calibration: Path) -> None:
    cpu = hw.load_profile("cpu", no_calibration)
    assert cpu.vendor == ()
    assert not cpu.has_figures
    assert cpu.peak_flops("f32") is None
    assert cpu.memory_bandwidth() is None
    assert cpu.memory_bytes() is None
    with pytest.raises(UserError) as err:
        hw.roofline_seconds(cpu, 1e9, 1e9, "f32")
    assert str(err.value) == (
        "profile `cpu` has no figures yet; it is filled by measurement (`polymorph microbench --backend cpu`)"
    )
    assert cpu.describe()[-1][:2] == ("Figures", "none yet")


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(UserError) as err:
        hw.load_profile("a100")
    assert str(err.value) == (
        "unknown chip `a100`; known profiles: b200, cpu, gb300, h100, h200, mi300x, mi355x, trn2 (a new "
        "chip is one profile file in a directory named by POLYMORPH_PROFILES)"
    )


# --- peak rates and dtypes ------------------------------------------------------------------------


def test_peak_flops_maps_dtype_names(no_calibration: Path) -> None:
    h100 = hw.load_profile("h100", no_calibration)
    fp8 = 1979e12
    for name in ("fp8e4m3", "fp8e5m2", "f8e4m3", "f8e5m2", "float8_e4m3fn", "float8_e5m2", "fp8"):
        assert h100.peak_flops(name) == pytest.approx(fp8), name
    assert h100.peak_flops("bfloat16") == h100.peak_flops("bf16") == pytest.approx(989e12)
    assert h100.peak_flops("f32") == pytest.approx(67e12)
    assert h100.peak_flops("tf32") == pytest.approx(494.5e12)
    assert h100.peak_flops(DType.F8E4M3) == pytest.approx(fp8)
    assert h100.peak_flops(DType.F16) == pytest.approx(989e12)
    # Known dtypes without a vendor rate give None; an unknown name is an error.
    assert h100.peak_flops("i32") is None
    assert h100.peak_flops("fp4") is None
    with pytest.raises(UserError, match="unknown dtype `bf61`; known dtypes: f32"):
        h100.peak_flops("bf61")


def test_every_ir_dtype_has_a_peak_mapping() -> None:
    for dtype in DType:
        hw.peak_key(dtype.value)  # raises for a dtype the roofline cannot place


# --- roofline ------------------------------------------------------------------------------------


def test_roofline_decode_floor_on_h200(no_calibration: Path) -> None:
    # Llama-3.2-1B bf16 batch-1 decode reads 2.47 GB per token (hardware.md).
    h200 = hw.load_profile("h200", no_calibration)
    flops = 2 * 1.235e9
    t = hw.roofline_seconds(h200, flops=flops, bytes_moved=2.47e9, dtype="bf16")
    assert t.memory_s == pytest.approx(2.47e9 / 4.8e12)
    assert t.memory_s * 1e3 == pytest.approx(0.515, abs=5e-4)
    assert t.compute_s == pytest.approx(flops / 989e12)
    assert t.floor_s == t.memory_s
    assert t.bound == "memory"


def test_roofline_compute_bound_gemm(no_calibration: Path) -> None:
    h100 = hw.load_profile("h100", no_calibration)
    n = 8192
    flops = 2.0 * n**3
    moved = 3.0 * n * n * 2  # A, B, C in bf16
    t = hw.roofline_seconds(h100, flops, moved, "bf16")
    assert t.compute_s == pytest.approx(flops / 989e12)
    assert t.memory_s == pytest.approx(moved / 3.35e12)
    assert t.bound == "compute"
    assert t.floor_s == t.compute_s == pytest.approx(1.1117e-3, rel=1e-3)


def test_roofline_missing_dtype_rate_names_what_exists(no_calibration: Path) -> None:
    mi355x = hw.load_profile("mi355x", no_calibration)
    with pytest.raises(UserError) as err:
        hw.roofline_seconds(mi355x, 1e12, 1e9, "tf32")
    assert "profile `mi355x` has no peak rate for tf32; it has: f32, bf16, f16, fp8, fp6, fp4" in str(
        err.value
    )
    # A pure data movement needs no peak rate.
    t = hw.roofline_seconds(mi355x, 0.0, 8e9, "tf32")
    assert (t.compute_s, t.memory_s, t.bound) == (0.0, pytest.approx(1e-3), "memory")


def test_roofline_rejects_negative_work(no_calibration: Path) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        hw.roofline_seconds(hw.load_profile("h100", no_calibration), -1.0, 0.0, "bf16")


# --- describe ------------------------------------------------------------------------------------


def test_describe_rows_carry_sources(no_calibration: Path) -> None:
    rows = hw.load_profile("h200", no_calibration).describe()
    by_label = {row.label: row for row in rows}
    assert by_label["Target"].value == "cuda:sm_90"
    assert by_label["Device memory bandwidth"].value == "4.8 TB/s"
    assert "H200 datasheet" in by_label["Device memory bandwidth"].source
    assert by_label["Peak fp8 (dense)"].value == "1,979 TFLOP/s"
    assert by_label["SMs"].value == "132"
    assert by_label["SMs"].source.startswith("[derived] ")
    assert all(len(row) == 3 for row in rows)
    labels = [row.label for row in rows]
    assert labels.index("Peak f32 (dense)") < labels.index("Peak bf16 (dense)") < labels.index("SMs")


# --- validation of a profile file ----------------------------------------------------------------

VALID = """\
schema_version = 1
id = "chip"
name = "Test chip"
target = "rocm:gfx942"
backend = "rocm"

[peak.bf16]
value = 1000
unit = "TFLOP/s"
source = "a datasheet"

[figures.memory_bandwidth]
value = 5
unit = "TB/s"
source = "a datasheet"

[figures.warp_size]
value = 64
source = "a datasheet"
"""


def _write(tmp_path: Path, text: str, name: str = "chip.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_valid_profile_file_loads(tmp_path: Path, no_calibration: Path) -> None:
    profile = hw.load_profile_file(_write(tmp_path, VALID), no_calibration)
    assert profile.id == "chip"
    assert profile.memory_bandwidth() == pytest.approx(5e12)
    assert profile.figure("peak.bf16").evidence == "spec"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            'source = "a datasheet"\n\n[figures.memory_bandwidth]',
            "\n[figures.memory_bandwidth]",
            "`peak.bf16.source` is missing or empty; cite the document",
        ),
        (
            'unit = "TB/s"\nsource = "a datasheet"',
            'unit = "TB/s"\nsource = "  "',
            "`figures.memory_bandwidth.source` is missing or empty",
        ),
        (
            'unit = "TB/s"',
            'unit = "TiB/s"',
            "`figures.memory_bandwidth.unit` is 'TiB/s'; a bandwidth figure takes `GB/s`, `TB/s`",
        ),
        ("value = 5\n", 'value = "5"\n', "`figures.memory_bandwidth.value` must be a number"),
        ("value = 5\n", "value = 0\n", "`figures.memory_bandwidth.value` must be positive"),
        ("[figures.warp_size]", "[figures.warpsize]", "unknown field `figures.warpsize`"),
        ("[peak.bf16]", "[peak.bfloat16]", "unknown field `peak.bfloat16`"),
        ('target = "rocm:gfx942"\n', "", "missing field `target`"),
        ('name = "Test chip"', "name = 3", "`name` must be a string"),
        ('"rocm:gfx942"', '"rocm:gfx1100"', "`target`: rocm arch `gfx1100` is not supported"),
        (
            'backend = "rocm"',
            'backend = "cuda"',
            "`backend` is `cuda` but target rocm:gfx942 belongs to `rocm`",
        ),
        ('id = "chip"', 'id = "other"', "`id` is `other` but the file is named chip.toml"),
        ("schema_version = 1", "schema_version = 2", "`schema_version` is 2; this polymorph reads 1"),
        ("schema_version = 1", "schema_version = true", "`schema_version` must be a int"),
        ("value = 64", "value = 16", "`figures.warp_size` is 16 but rocm warps are 32 or 64 wide"),
        (
            'source = "a datasheet"\n\n[figures.warp_size]',
            'source = "x"\nevidence = "derived"\n\n[figures.warp_size]',
            "`figures.memory_bandwidth` is derived; add a `note`",
        ),
        (
            'source = "a datasheet"\n\n[figures.warp_size]',
            'source = "x"\nevidence = "rumour"\n\n[figures.warp_size]',
            "`figures.memory_bandwidth.evidence` is 'rumour'",
        ),
        (
            'source = "a datasheet"\n\n[figures.warp_size]',
            'source = "x"\ncolour = 1\n\n[figures.warp_size]',
            "unknown field `figures.memory_bandwidth.colour`",
        ),
        (
            '[figures.memory_bandwidth]\nvalue = 5\nunit = "TB/s"\nsource = "a datasheet"\n',
            "[figures]\nmemory_bandwidth = 5\n",
            "`figures.memory_bandwidth` must be a table",
        ),
        ('name = "Test chip"', 'name = "Test chip"\nvendor = "acme"', "unknown field `vendor`"),
        ("[peak.bf16]", "[peak.bf16", "not valid TOML"),
    ],
)
def test_malformed_profile_names_file_and_field(
    tmp_path: Path, no_calibration: Path, old: str, new: str, expected: str
) -> None:
    assert old in VALID
    path = _write(tmp_path, VALID.replace(old, new, 1))
    with pytest.raises(UserError) as err:
        hw.load_profile_file(path, no_calibration)
    message = str(err.value)
    assert message.startswith(f"{path}: ")
    assert expected in message
    assert "\n" not in message


def test_count_figures_are_whole_numbers(tmp_path: Path, no_calibration: Path) -> None:
    text = VALID.replace('target = "rocm:gfx942"', 'target = "neuron:trn2"').replace('"rocm"', '"neuron"')
    path = _write(tmp_path, text.replace("value = 64", "value = 63.5"))
    with pytest.raises(UserError, match=r"`figures\.warp_size\.value` is a count and must be a whole number"):
        hw.load_profile_file(path, no_calibration)


def test_cpu_profile_may_not_carry_vendor_figures(tmp_path: Path, no_calibration: Path) -> None:
    text = VALID.replace('target = "rocm:gfx942"', 'target = "cpu"').replace('"rocm"', '"cpu"')
    with pytest.raises(UserError, match="a cpu profile carries no vendor figures"):
        hw.load_profile_file(_write(tmp_path, text), no_calibration)


# --- calibration overlay -------------------------------------------------------------------------

CALIBRATION = """\
schema_version = 1
profile = "h200"

[provenance]
date = 2026-11-20
device = "NVIDIA H200"
driver = "570.124.06"
commit = "3f2c1a9"
command = "polymorph microbench --backend cuda"

[provenance.toolchain]
torch = "2.11.0"
triton = "3.6.0"

[figures.memory_bandwidth]
value = 4.32
unit = "TB/s"
method = "read-only streaming kernel over 4 GiB"

[peak.bf16]
value = 788
unit = "TFLOP/s"
method = "bf16 GEMM sweep on random data"
"""


def test_calibration_overlay_replaces_bandwidth_and_keeps_provenance(tmp_path: Path) -> None:
    _write(tmp_path, CALIBRATION, "h200.toml")
    h200 = hw.load_profile("h200", tmp_path)
    assert h200.memory_bandwidth() == pytest.approx(4.32e12)
    assert h200.memory_bandwidth(calibrated=False) == pytest.approx(4.8e12)
    assert h200.peak_flops("bf16") == pytest.approx(788e12)
    assert h200.peak_flops("bf16", calibrated=False) == pytest.approx(989e12)
    # Figures the calibration does not measure stay the vendor's.
    assert h200.peak_flops("fp8") == pytest.approx(1979e12)
    assert h200.memory_bytes() == 141_000_000_000

    cal = h200.calibration
    assert cal is not None
    assert (cal.date, cal.device, cal.driver, cal.commit) == (
        "2026-11-20",
        "NVIDIA H200",
        "570.124.06",
        "3f2c1a9",
    )
    assert cal.toolchain == (("torch", "2.11.0"), ("triton", "3.6.0"))
    assert cal.command == "polymorph microbench --backend cuda"
    measured = h200.measured_figure("memory_bandwidth")
    assert measured is not None and measured.evidence == "measured"
    # The vendor figure is untouched, source and all.
    vendor = h200.vendor_figure("memory_bandwidth")
    assert vendor is not None and vendor.si == pytest.approx(4.8e12) and "H200 datasheet" in vendor.source

    t = hw.roofline_seconds(h200, 0.0, 2.47e9, "bf16")
    assert t.memory_s == pytest.approx(2.47e9 / 4.32e12)

    rows = {row.label: row for row in h200.describe()}
    assert rows["Device memory bandwidth"].value == "4.8 TB/s"
    assert rows["Device memory bandwidth (measured)"].value == "4.32 TB/s"
    source = rows["Device memory bandwidth (measured)"].source
    assert "measured 2026-11-20 on NVIDIA H200" in source
    assert "driver 570.124.06" in source and "torch 2.11.0" in source and "commit 3f2c1a9" in source


def test_calibration_fills_the_cpu_profile(tmp_path: Path) -> None:
    text = (
        CALIBRATION.replace('profile = "h200"', 'profile = "cpu"')
        .replace('"NVIDIA H200"', '"AMD EPYC 9654"')
        .replace("value = 4.32", "value = 300")
        .replace('unit = "TB/s"', 'unit = "GB/s"')
        .replace("[peak.bf16]\nvalue = 788", "[peak.f32]\nvalue = 5.5")
    )
    _write(tmp_path, text, "cpu.toml")
    cpu = hw.load_profile("cpu", tmp_path)
    assert cpu.has_figures
    t = hw.roofline_seconds(cpu, flops=5.5e12, bytes_moved=600e9, dtype="f32")
    assert t.compute_s == pytest.approx(1.0)
    assert t.memory_s == pytest.approx(2.0)
    assert t.bound == "memory"
    with pytest.raises(UserError, match="profile `cpu` has no peak rate for bf16; it has: f32"):
        hw.roofline_seconds(cpu, 1.0, 1.0, "bf16")


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('driver = "570.124.06"\n', "", "missing field `provenance.driver`"),
        ('commit = "3f2c1a9"\n', "", "missing field `provenance.commit`"),
        (
            "date = 2026-11-20",
            'date = "last tuesday"',
            "`provenance.date` `last tuesday` is not an ISO 8601 date",
        ),
        ('torch = "2.11.0"', "torch = 2.11", "`provenance.toolchain.torch` must be a version string"),
        (
            'method = "read-only streaming kernel over 4 GiB"\n',
            "",
            "`figures.memory_bandwidth.method` is missing",
        ),
        ('method = "bf16 GEMM sweep on random data"', 'source = "x"', "unknown field `peak.bf16.source`"),
        ('profile = "h200"', 'profile = "h100"', "`profile` is `h100` but this file calibrates `h200`"),
        ("[figures.memory_bandwidth]", "[figures.bandwidth]", "unknown field `figures.bandwidth`"),
    ],
)
def test_malformed_calibration_names_file_and_field(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    assert old in CALIBRATION
    path = _write(tmp_path, CALIBRATION.replace(old, new, 1), "h200.toml")
    with pytest.raises(UserError) as err:
        hw.load_profile("h200", tmp_path)
    assert str(err.value).startswith(f"{path}: ")
    assert expected in str(err.value)


def test_string_dates_are_accepted(tmp_path: Path) -> None:
    _write(tmp_path, CALIBRATION.replace("date = 2026-11-20", 'date = "2026-11-20T10:00:00"'), "h200.toml")
    cal = hw.load_profile("h200", tmp_path).calibration
    assert cal is not None and cal.date == "2026-11-20T10:00:00"


def test_missing_calibration_directory_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"calibration directory .* does not exist"):
        hw.load_profile("h200", tmp_path / "nowhere")


def test_readme_example_is_a_valid_calibration(tmp_path: Path) -> None:
    # The format documented for the microbench writer must be the format the loader accepts.
    readme = (hw.profiles_dir() / "measured" / "README.md").read_text()
    example = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    tomllib.loads(example)
    _write(tmp_path, example, "h200.toml")
    h200 = hw.load_profile("h200", tmp_path)
    assert h200.memory_bandwidth() == pytest.approx(4.32e12)
    assert h200.calibration is not None and ("python", "3.11.7") in h200.calibration.toolchain


# --- datasheet and measured side by side (`polymorph hw`) ------------------------------------------

_SI = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def _si(text: str, unit: str) -> float:
    """'788 TFLOP/s' -> 7.88e14 (the CLI's quantities)."""
    number, scaled = text.split(" ")
    assert scaled.endswith(unit), (text, unit)
    return float(number.replace(",", "")) * _SI[scaled.removesuffix(unit)]


def test_figure_rows_put_the_measured_figure_beside_the_datasheet(tmp_path: Path) -> None:
    _write(tmp_path, CALIBRATION, "h200.toml")
    h200 = hw.load_profile("h200", tmp_path)
    measured = tomllib.loads(CALIBRATION)
    rows = {r.label: r for r in h200.figure_rows()}
    bw = rows["Device memory bandwidth"]
    assert (bw.datasheet, bw.measured) == (
        "4.8 TB/s",
        f"{measured['figures']['memory_bandwidth']['value']:g} TB/s",
    )
    assert "H200 datasheet" in bw.source and "measured: read-only streaming kernel" in bw.source
    assert rows["Peak bf16 (dense)"].measured == "788 TFLOP/s"
    assert rows["Peak fp8 (dense)"].measured == ""  # not measured: the column is empty, not the vendor's
    assert len(rows) == len(h200.figure_rows())  # one row per figure, not one per source

    row = hw.ListingRow.of(h200)
    assert row.bf16_measured == pytest.approx(measured["peak"]["bf16"]["value"] * 1e12)
    assert row.bf16_datasheet == pytest.approx(989e12)
    assert row.bandwidth_measured == pytest.approx(4.32e12) and row.bandwidth_datasheet == pytest.approx(
        4.8e12
    )
    h100 = hw.ListingRow.of(hw.load_profile("h100", tmp_path))
    assert h100.bf16_measured is None and h100.bf16_datasheet == pytest.approx(989e12)


def test_hw_lists_datasheet_and_measured_in_their_own_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A measured H200 (788 TFLOP/s bf16 here) sits in the measured column, its datasheet 989 in the
    datasheet column, so it no longer reads as slower than the H100's 989 datasheet."""
    from polymorph.cli import main

    _write(tmp_path, CALIBRATION, "h200.toml")
    monkeypatch.setenv("POLYMORPH_CALIBRATION_DIR", str(tmp_path))
    assert main(["hw"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[1].split("\t")
    rows = {
        r[0]: dict(zip(header, r, strict=True))
        for r in (line.split("\t") for line in lines[2:])
        if len(r) > 1
    }
    vendor = {
        pid: tomllib.loads((Path(hw.profiles_dir()) / f"{pid}.toml").read_text()) for pid in ("h100", "h200")
    }
    for pid, data in vendor.items():
        peak = data["peak"]["bf16"]
        assert _si(rows[pid]["bf16 datasheet"], "FLOP/s") == pytest.approx(peak["value"] * 1e12, rel=1e-3)
    assert _si(rows["h200"]["bf16 measured"], "FLOP/s") == pytest.approx(788e12, rel=1e-3)
    assert _si(rows["h200"]["memory measured"], "B/s") == pytest.approx(4.32e12, rel=1e-3)
    assert _si(rows["h200"]["memory datasheet"], "B/s") == pytest.approx(4.8e12, rel=1e-3)
    assert rows["h100"]["bf16 measured"] == "" and rows["cpu"]["bf16 datasheet"] == ""

    assert main(["hw", "h200"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1].split("\t") == ["figure", "datasheet", "measured", "source"]
    by_label = {r[0]: r for r in (line.split("\t") for line in lines[2:]) if len(r) == 4}
    assert by_label["Peak bf16 (dense)"][1:3] == ["989 TFLOP/s", "788 TFLOP/s"]
    assert by_label["Device memory bandwidth"][1:3] == ["4.8 TB/s", "4.32 TB/s"]
    assert "measured figures: measured 2026-11-20 on NVIDIA H200" in out
