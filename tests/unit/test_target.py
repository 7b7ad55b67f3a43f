"""polymorph.hardware.target: parsing target strings into a validated (family, arch), and the fields backends use."""

from __future__ import annotations

import pytest

from polymorph.errors import UserError
from polymorph.hardware.target import Target, known_targets

ACCEPTED = ["cuda:sm_90", "cuda:sm_100", "cuda:sm_103", "rocm:gfx942", "rocm:gfx950", "neuron:trn2", "cpu"]


def test_known_targets_are_exactly_the_supported_ones() -> None:
    assert sorted(known_targets()) == sorted(ACCEPTED)


@pytest.mark.parametrize("text", ACCEPTED)
def test_parse_round_trips(text: str) -> None:
    target = Target.parse(text)
    assert str(target) == text
    assert Target.parse(str(target)) == target


def test_parse_splits_family_and_arch() -> None:
    assert Target.parse("rocm:gfx950") == Target("rocm", "gfx950")
    assert Target.parse("cpu") == Target("cpu", None)
    assert Target.parse("cpu").arch is None


@pytest.mark.parametrize(
    ("text", "cc"), [("cuda:sm_90", (9, 0)), ("cuda:sm_100", (10, 0)), ("cuda:sm_103", (10, 3))]
)
def test_compute_capability(text: str, cc: tuple[int, int]) -> None:
    target = Target.parse(text)
    assert target.compute_capability == cc
    assert target.triton_arch == cc[0] * 10 + cc[1]


def test_gpu_properties() -> None:
    h = Target.parse("cuda:sm_90")
    m = Target.parse("rocm:gfx942")
    assert h.is_gpu and m.is_gpu
    assert not Target.parse("cpu").is_gpu and not Target.parse("neuron:trn2").is_gpu
    assert h.warp_sizes == (32,)
    assert m.warp_sizes == (32, 64)  # CDNA wave64, RDNA wave32: a chip's own width is its profile's
    assert Target.parse("neuron:trn2").warp_sizes == ()
    assert Target.parse("cpu").warp_sizes == ()
    assert m.gfx_arch == "gfx942"
    assert m.triton_arch == "gfx942"
    assert (h.compute_unit, m.compute_unit, Target.parse("neuron:trn2").compute_unit) == (
        "SM",
        "CU",
        "NeuronCore",
    )


def test_family_specific_properties_refuse_other_families() -> None:
    with pytest.raises(ValueError, match="cuda property"):
        _ = Target.parse("rocm:gfx950").compute_capability
    with pytest.raises(ValueError, match="rocm property"):
        _ = Target.parse("cuda:sm_90").gfx_arch
    with pytest.raises(ValueError, match="GPU property"):
        _ = Target.parse("neuron:trn2").triton_arch


def test_targets_are_frozen_and_hashable() -> None:
    target = Target.parse("cuda:sm_90")
    with pytest.raises(AttributeError):
        target.arch = "sm_100"  # type: ignore[misc]
    assert {target, Target.parse("cuda:sm_90")} == {target}


@pytest.mark.parametrize("text", ["tpu:v5", "metal", "hip:gfx942", "CUDA:sm_90", "", "gpu"])
def test_unknown_family_lists_accepted_targets(text: str) -> None:
    with pytest.raises(UserError) as err:
        Target.parse(text)
    message = str(err.value)
    assert f"unknown target `{text}`" in message
    for accepted in ACCEPTED:
        assert accepted in message


@pytest.mark.parametrize(
    "text", ["cuda:90", "cuda:sm90", "cuda:sm_9", "rocm:942", "rocm:mi300x", "neuron:inf2"]
)
def test_malformed_arch_names_the_form(text: str) -> None:
    with pytest.raises(UserError, match="write it as") as err:
        Target.parse(text)
    family = text.partition(":")[0]
    assert all(a in str(err.value) for a in ACCEPTED if a.startswith(family + ":"))


@pytest.mark.parametrize("text", ["cuda:sm_80", "cuda:sm_90a", "rocm:gfx1100", "rocm:gfx90a", "neuron:trn1"])
def test_unsupported_arch_lists_the_family_archs(text: str) -> None:
    family = text.partition(":")[0]
    with pytest.raises(UserError) as err:
        Target.parse(text)
    message = str(err.value)
    assert "accepted" in message
    assert all(a in message for a in ACCEPTED if a.startswith(family + ":"))


def test_arch_presence_is_checked() -> None:
    with pytest.raises(UserError, match="needs an arch"):
        Target.parse("cuda")
    with pytest.raises(UserError, match="empty arch"):
        Target.parse("rocm:")
    with pytest.raises(UserError, match="takes no arch"):
        Target.parse("cpu:x86_64")


def test_direct_construction_is_validated_too() -> None:
    # Every Target that exists is a supported one, however it was made.
    with pytest.raises(UserError, match="not supported"):
        Target("cuda", "sm_80")
    with pytest.raises(UserError, match="unknown target family"):
        Target("tpu", None)


def test_unsupported_arch_names_profile_files_that_could_not_be_read(tmp_path, monkeypatch) -> None:
    # A user's profile with a syntax error must not read as "no profile names this chip".
    (tmp_path / "l4.toml").write_text('target = "cuda:sm_89"\n[figures\n', encoding="utf-8")
    (tmp_path / "notarget.toml").write_text("[figures]\n", encoding="utf-8")
    monkeypatch.setenv("POLYMORPH_PROFILES", str(tmp_path))
    with pytest.raises(UserError) as err:
        Target.parse("cuda:sm_89")
    text = str(err.value)
    assert "not supported" in text
    assert f"{tmp_path / 'l4.toml'} (TOMLDecodeError" in text
    assert f"{tmp_path / 'notarget.toml'} (no string `target` field)" in text
    assert "\n" not in text
    monkeypatch.delenv("POLYMORPH_PROFILES")
    with pytest.raises(UserError) as err:
        Target.parse("cuda:sm_89")
    assert "left out" not in str(err.value)
