"""The built-in agents propose from the real kernel library's spaces, never repeat a tried candidate,
refine from measured results, and give their reasoning."""

from __future__ import annotations

from pathlib import Path

from polymorph.pipeline.kernel_files import kernels_root
from polymorph.search.agents import (
    ConfigAutotuner,
    GroupSpace,
    MutationAgent,
    Outcome,
    Schedule,
    VariantExplorer,
    builtin_agents,
)

SWIGLU = kernels_root() / "triton" / "rmsnorm_swiglu.py"
LINEAR = kernels_root() / "torch" / "linear.py"


def _space(configs, kernel=SWIGLU, alternatives=(), share=0.5, signature="sig-a") -> GroupSpace:
    return GroupSpace(signature=signature, group="layers.0.mlp", groups=("layers.0.mlp", "layers.1.mlp"),
                      pattern="rmsnorm+linear+silu*mul", stock_kernel=kernel, stock_config=configs[0],
                      configs=configs, alternatives=alternatives, share=share)  # fmt: skip


CONFIGS = [
    {"gemv_block_n": 8, "gemv_block_k": 1024, "gemv_warps": 4},
    {"gemv_block_n": 4, "gemv_block_k": 512, "gemv_warps": 4},
    {"gemv_block_n": 2, "gemv_block_k": 2048, "gemv_warps": 8},
]


def test_autotuner_samples_every_declared_config_once_then_crosses_the_best_two() -> None:
    space = _space(CONFIGS)
    agent = ConfigAutotuner(seed=3)
    tried: dict = {}
    first = agent.propose(space, tried, 10)
    assert sorted(map(str, (p.config for p in first))) == sorted(map(str, CONFIGS))
    assert all("sample" in p.reasoning and space.stock_kernel.name in p.reasoning for p in first)
    for p, t in zip(first, (3e-6, 1e-6, 2e-6), strict=True):
        tried[p.key] = Outcome(True, t)
    refined = agent.propose(space, tried, 10)
    assert refined, "measured configs must lead to refinements"
    fastest = first[1].config
    second = first[2].config
    for p in refined:
        assert p.key not in tried
        assert all(p.config[k] in (fastest[k], second[k]) for k in p.config)
        assert "refine" in p.reasoning


def test_variant_explorer_proposes_other_files_not_the_stock_one() -> None:
    alt = (LINEAR, [{"weight_layout": "kn"}])
    space = _space(CONFIGS, alternatives=[alt])
    props = VariantExplorer().propose(space, {}, 5)
    assert [p.kernel for p in props] == [LINEAR]
    assert LINEAR.name in props[0].reasoning
    tried = {props[0].key: Outcome(False, None, "numerics")}
    assert VariantExplorer().propose(space, tried, 5) == []


def test_mutation_starts_from_the_fastest_measured_and_changes_one_key() -> None:
    space = _space(CONFIGS)
    best = Outcome(True, 1e-6)
    from polymorph.search.agents import candidate_key

    tried = {candidate_key(space.signature, SWIGLU, CONFIGS[1]): best}
    props = MutationAgent(seed=1).propose(space, tried, 50)
    assert props
    for p in props:
        diff = [k for k in CONFIGS[1] if p.config[k] != CONFIGS[1][k]]
        assert len(diff) == 1, p.config
        assert "fastest measured" in p.reasoning
    assert any(p.config["gemv_block_k"] == 1024 for p in props)  # 512 doubled
    assert any(p.config["gemv_warps"] == 5 or p.config["gemv_warps"] == 3 for p in props)


def test_schedule_visits_the_largest_share_first_and_never_repeats() -> None:
    big = _space(CONFIGS, share=0.8, signature="big")
    small = _space(
        [{"weight_layout": "nk"}, {"weight_layout": "kn"}], kernel=LINEAR, share=0.1, signature="small"
    )
    sched = Schedule([small, big], builtin_agents(seed=0), per_round=1)
    tried: dict = {}
    batch = sched.next_batch(tried, 3)
    assert batch[0].signature == "big"
    keys = set()
    for _ in range(6):
        for p in batch:
            assert p.key not in keys and p.key not in tried
            keys.add(p.key)
            tried[p.key] = Outcome(True, 1e-6 * (1 + len(tried)))
        batch = sched.next_batch(tried, 3)
    assert {k[0] for k in keys} == {"big", "small"}


def test_candidate_keys_resolve_paths(tmp_path: Path) -> None:
    from polymorph.search.agents import candidate_key

    f = tmp_path / "k.py"
    f.write_text("x = 1\n")
    assert candidate_key("s", f, {"a": 1, "b": 2}) == candidate_key(
        "s", tmp_path / "." / "k.py", {"b": 2, "a": 1}
    )
