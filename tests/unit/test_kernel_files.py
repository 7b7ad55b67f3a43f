"""Shared kernel modules (`kernel_files.depend`): pinned by content hash in the kernel's own text, so a
plan's kernel hash still names every line it runs; carried into compile outputs; never substituted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polymorph import api
from polymorph.errors import UserError
from polymorph.models import load_model
from polymorph.pipeline import kernel_files

PIN = re.compile(r'depend\(\s*"([^"]+)",\s*"([0-9a-f]{64})"\s*\)')
LIBRARY = kernel_files.kernels_root()


def pinning_files() -> list[Path]:
    return [p for p in sorted(LIBRARY.glob("*/*.py")) if PIN.search(p.read_text())]


def test_every_pin_in_the_library_names_the_shared_module_as_it_is() -> None:
    files = pinning_files()
    assert len(files) >= 10  # the projections, the attention, norm, rope and elementwise kernels
    for path in files:
        for name, sha in PIN.findall(path.read_text()):
            now = kernel_files.source_hash((LIBRARY / name).read_bytes())
            assert sha == now, f"{path.name} pins {name} at {sha[:12]}, it is {now[:12]}: run --repin"


def test_a_kernel_records_what_it_depends_on_and_gets_shared_modules_of_its_own() -> None:
    a = kernel_files.load_kernel(LIBRARY / "triton" / "rmsnorm_linear.py")
    b = kernel_files.load_kernel(LIBRARY / "triton" / "linear_residual.py")
    # The projection core, and what it pins in turn (the interpreter's corrections).
    assert a.depends == b.depends
    assert [name for name, _ in a.depends] == [
        "triton/_interpreter.py",
        "triton/_pdl.py",
        "triton/_projection.py",
        "triton/_targets.py",
    ]
    # Fresh per importer, as the kernel file itself is: a candidate that rebinds something in its
    # shared module cannot change the stock kernel beside it.
    assert a.module._p is not b.module._p
    a.module._p.GEMV_MAX_M = 64
    assert b.module._p.GEMV_MAX_M == 2


def test_shared_modules_read_the_interpreter_setting_of_their_importer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    interpreted = kernel_files.load_kernel(LIBRARY / "triton" / "linear_residual.py")
    monkeypatch.delenv("TRITON_INTERPRET")
    compiled = kernel_files.load_kernel(LIBRARY / "triton" / "linear_residual.py")
    assert bool(interpreted.module._p._INTERPRETED) and not bool(compiled.module._p._INTERPRETED)


def test_a_stale_pin_is_one_clear_error(tmp_path: Path) -> None:
    source = (LIBRARY / "triton" / "linear_residual.py").read_text()
    name, sha = PIN.search(source).groups()
    stale = tmp_path / "linear_residual.py"
    stale.write_text(source.replace(sha, "0" * 64))
    with pytest.raises(UserError, match=r"_projection\.py at sha256 000000000000 .*--repin"):
        kernel_files.load_kernel(stale)


def test_repin_refuses_a_cycle(tmp_path: Path) -> None:
    root = tmp_path / "kernels"
    (root / "triton").mkdir(parents=True)
    (root / "triton" / "_a.py").write_text(f'b = depend("triton/_b.py", "{"0" * 64}")\n')
    (root / "triton" / "_b.py").write_text(f'a = depend("triton/_a.py", "{"0" * 64}")\n')
    with pytest.raises(UserError, match="cycle"):
        kernel_files.repin(root)


def test_repin_rewrites_only_stale_pins(tmp_path: Path) -> None:
    root = tmp_path / "kernels"
    (root / "triton").mkdir(parents=True)
    shared = root / "triton" / "_shared.py"
    shared.write_text("X = 1\n")
    user = root / "triton" / "user.py"
    user.write_text(f'm = depend("triton/_shared.py", "{"a" * 64}")\n')
    fresh = root / "triton" / "fresh.py"
    current = kernel_files.source_hash(shared.read_bytes())
    fresh.write_text(f'm = depend("triton/_shared.py", "{current}")\n')
    assert kernel_files.repin(root) == [user]
    assert PIN.search(user.read_text())[2] == current


def test_a_compile_output_carries_the_shared_modules_its_kernels_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = api.lower(load_model("llama-tiny", dtype="bf16"), "cuda").plan
    pinned = [
        g
        for g in plan.groups
        if PIN.search(kernel_files.load_choice(g.kernel.file, g.kernel.sha256).path.read_text())
    ]
    assert pinned, "the cuda plan of llama-tiny uses no kernel with a shared module"
    written = kernel_files.copy_kernel_sources(plan, tmp_path)
    shared = {name: kernel_files.source_hash((LIBRARY / name).read_bytes())
              for name in ("triton/_projection.py", "triton/_interpreter.py", "triton/_targets.py",
                           "triton/_pdl.py")}  # fmt: skip
    assert {f"kernels/{sha}.py" for sha in shared.values()} <= set(written)
    # Without the library (another installed version), every kernel loads from the output alone.
    empty = tmp_path / "no-library"
    empty.mkdir()
    monkeypatch.setattr(kernel_files, "kernels_root", lambda: empty)
    for group in pinned:
        kernel = kernel_files.load_choice(group.kernel.file, group.kernel.sha256, tmp_path)
        assert set(kernel.depends) <= set(shared.items()) and kernel.depends


def test_an_agent_prompt_shows_the_shared_code_the_best_kernel_runs() -> None:
    from polymorph.search.external import build_prompt

    class Space:
        group, groups, signature, pattern, share = (
            "layers.0.mlp.down+residual",
            ["g"],
            "sig",
            "linear+residual",
            0.1,
        )

    prompt = build_prompt(Space(), {}, (LIBRARY / "triton" / "linear_residual.py", {}))
    assert "def gemv_tile(" in prompt and "shared module `triton/_projection.py`" in prompt


def test_a_shared_module_with_crlf_line_ends_is_carried_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    library = tmp_path / "kernels"
    (library / "triton").mkdir(parents=True)
    shared = b"SCALE = 2\r\n"
    (library / "triton" / "_crlf.py").write_bytes(shared)
    sha = kernel_files.source_hash(shared)
    kernel = library / "triton" / "k.py"
    kernel.write_text(
        f'from polymorph.pipeline.kernel_files import depend\n_s = depend("triton/_crlf.py", "{sha}")\n'
        "IMPLEMENTS = 'relu'\nCONFIGS = [{}]\n\n\ndef supports(spec):\n    return True\n\n\n"
        "def build(spec, config, target):\n    return None\n"
    )
    monkeypatch.setattr(kernel_files, "kernels_root", lambda: library)
    choice = SimpleNamespace(file="triton/k.py", sha256=kernel_files.source_hash(kernel.read_bytes()))
    out = tmp_path / "out"
    kernel_files.copy_kernel_sources(SimpleNamespace(groups=[SimpleNamespace(kernel=choice)]), out)
    assert (out / "kernels" / f"{sha}.py").read_bytes() == shared
    assert kernel_files.load_choice("triton/k.py", choice.sha256, out).module._s.SCALE == 2
