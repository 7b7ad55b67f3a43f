"""What `polymorph mcp` may see and do: a read-only view of the board, the tunes published on it and
the registry, plus the one write every outside agent has (`Board.post` to a bare node group).

Trust: agents are hostile. This view never imports or runs a kernel file (stock sources are read as
text; specs and configs come from what the tune published), holds no engine and so no reference
output or gate input, and has no path to `claim`, `post_result`, `adopt`, `reopen` or the registry's
writes: a candidate it posts is gated and timed by the tune's workers like any other. Every argument
is checked here, so a malformed one is a UserError naming it (the server turns it into a tool error).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from polymorph.errors import UserError
from polymorph.search.board import Board, Candidate
from polymorph.search.live_tunes import LiveTune, LiveTunes

MAX_SOURCE_CHARS = 256_000  # a kernel file; the library's largest is ~20 kB
MAX_REASONING_CHARS = 16_000
MAX_CONFIG_CHARS = 4_000
MAX_WAIT_S = 600.0
_AGENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._ -]{0,63}")
_SAME = re.compile(r"the same kernel and config as candidate (\d+), measured there")


class TuneBoardView:
    """The view over the board file `board` and the registry file `registry` (either may not exist yet:
    each call says so)."""

    def __init__(self, board: Path, registry: Path | None = None) -> None:
        self.board_path, self.registry_path = Path(board), registry

    # --- reading -------------------------------------------------------------------------------------

    def tunes(self) -> list[dict[str, Any]]:
        """Every tune published on the board, running ones first, each with its groups' figures."""
        tunes = self._tunes()
        cands = self._candidates()
        return [self._tune_summary(t, cands) for t in sorted(tunes, key=lambda t: not t.running)]

    def group(self, tune: str | None, group: str) -> dict[str, Any]:
        """One group's search space: spec, stock kernel and config, the configs it declares, the
        library's other files for it, its figures."""
        t = self._tune(tune)
        space = self._space(t, group)
        figures = _figures(t, space, self._candidates())
        return {"tune": t.scope, "backend": t.backend, "target": t.profile, **figures,
                "groups": space["groups"], "stock_kernel": space["stock_kernel"],
                "stock_config": space["stock_config"], "configs": space["configs"],
                "alternatives": space["alternatives"], "flops": space.get("flops"), "bytes": space.get("bytes"),
                "bound": space.get("bound"), "spec": space["spec"]}  # fmt: skip

    def source(self, tune: str | None, group: str, which: str) -> dict[str, Any]:
        """The source of the group's `which` kernel: "stock" (the plan's), "best" (the fastest that
        passed on this board for this tune so far) or "registry" (the registry's champion for the key)."""
        t = self._tune(tune)
        space = self._space(t, group)
        if which == "stock":
            return {"which": "stock", "kernel": space["stock_kernel"], "config": space["stock_config"],
                    "reasoning": "the kernel and config the plan `compile` makes", **_library_text(space["stock_kernel"])}  # fmt: skip
        if which == "best":
            best = _best(t, space, self._candidates())
            if best is None:
                raise UserError(f"no candidate for `{space['group']}` has passed in tune {t.scope} yet")
            c, r = best
            return {"which": "best", "candidate": c.id, "agent": c.agent, "config": c.config,
                    "reasoning": c.reasoning, "median_s": r.measurements.get("median_s"),
                    "source": c.source, "shared_modules": []}  # fmt: skip
        if which == "registry":
            champ = self._champion(t, space)
            if champ is None:
                raise UserError(
                    f"the registry has no champion for `{space['group']}`'s key ({t.profile}, {t.bucket})"
                )
            return {"which": "registry", "kernel": champ.kernel, "agent": champ.agent, "config": dict(champ.config),
                    "reasoning": champ.reasoning, "median_s": champ.measurement.median_s, "source": champ.source,
                    "shared_modules": [{"sha256": sha, "source": text} for sha, text in champ.shared.items()]}  # fmt: skip
        raise UserError(f"`which` is stock, best or registry, got {which!r}")

    def profile(self, tune: str | None) -> dict[str, Any]:
        """The tune's chip: datasheet and measured figures side by side, the calibration's provenance and
        its curves (rate by call size)."""
        from polymorph.hardware.profile import load_profile

        t = self._tune(tune)
        p = load_profile(t.profile)
        cal = p.calibration
        curves = [] if cal is None else [
            {"name": c.name, "unit": c.unit, "method": c.method,
             "points": [{"size": pt.size, "value": pt.value, "shape": pt.shape, "spread": pt.spread} for pt in c.points]}
            for c in cal.curves
        ]  # fmt: skip
        return {"profile": p.id, "name": p.name, "target": str(p.target), "note": p.note,
                "figures": [row._asdict() for row in p.figure_rows()],
                "calibration": None if cal is None else cal.provenance(),
                "calibration_hint": None if cal is not None else
                f"no calibration: run `polymorph microbench --backend {t.backend}` on this machine",
                "curves": curves}  # fmt: skip

    def history(self, tune: str | None, group: str, limit: int = 50) -> dict[str, Any]:
        """What was tried for the group's op signature in this tune (and posted for it, not yet taken),
        newest first: who, which config, why, and the verdict with the gate that rejected it."""
        limit = _int(limit, "limit", 1, 500)
        t = self._tune(tune)
        space = self._space(t, group)
        rows = [_candidate_row(c) for c in reversed(self._candidates()) if _in_space(t, space, c)]
        return {"tune": t.scope, "group": space["group"], "signature": space["signature"], "tried": rows[:limit],
                "more": max(0, len(rows) - limit)}  # fmt: skip

    def result(self, candidate: int, timeout_s: float) -> dict[str, Any]:
        """Wait up to `timeout_s` for `candidate`'s verdict: passed (with its time), rejected (with the
        gate named), failed (it could not be built or run, or its worker was lost), or pending."""
        candidate = _int(candidate, "candidate", 1, 1 << 62)
        timeout_s = _number(timeout_s, "timeout_s", 0.0, MAX_WAIT_S)
        board = self._board()
        try:
            deadline = time.monotonic() + timeout_s
            seen = [candidate]
            while True:
                r = board.wait(seen[-1], max(0.0, deadline - time.monotonic()))
                same = None if r is None or r.ok else _SAME.fullmatch(r.cause)
                if same is None or int(same[1]) in seen:  # a duplicate's verdict is the other one's
                    break
                seen.append(int(same[1]))
            c = board.show(seen[-1])
        finally:
            board.close()
        out = _candidate_row(c, full=True)
        if len(seen) > 1:
            out["same_as"] = seen[-1]
            out["posted_id"] = candidate
        return out

    # --- the one write -------------------------------------------------------------------------------

    def post(self, tune: str | None, group: str, source: str | None, config: Any, reasoning: str,
             agent: str) -> dict[str, Any]:  # fmt: skip
        """Post a candidate for `group` of a running tune: a kernel file's text (with a config of its own,
        or {} for its first) or a config alone for the group's stock kernel. Returns its id."""
        t = self._tune(tune)
        space = self._space(t, group)
        if not t.running:
            raise UserError(f"tune {t.scope} is no longer running: nothing would measure this candidate")
        if source is not None:
            if not isinstance(source, str):
                raise UserError("`source` must be the kernel file's text")
            if len(source) > MAX_SOURCE_CHARS:
                raise UserError(f"`source` is {len(source)} characters; the limit is {MAX_SOURCE_CHARS}")
            if "IMPLEMENTS" not in source or "def build" not in source:
                raise UserError(
                    "`source` is no kernel file: it needs IMPLEMENTS and def build (see the contract)"
                )
        if config is not None and not isinstance(config, dict):
            raise UserError(f"`config` must be a JSON object, got {type(config).__name__}")
        if config is not None and len(json.dumps(config, default=str)) > MAX_CONFIG_CHARS:
            raise UserError(f"`config` is over {MAX_CONFIG_CHARS} characters of JSON")
        if not isinstance(reasoning, str) or len(reasoning) > MAX_REASONING_CHARS:
            raise UserError(f"`reasoning` must be text of at most {MAX_REASONING_CHARS} characters")
        if not isinstance(agent, str) or not _AGENT.fullmatch(agent):
            raise UserError("`agent` is a name of 1-64 letters, digits, spaces, '.', '_' or '-'")
        board = self._board()
        before = time.time()
        try:
            cid = board.post(group=space["group"], backend=t.backend, target=t.profile, source=source,
                             config=config, agent=agent, reasoning=reasoning)  # fmt: skip
            c = board.show(cid)
        finally:
            board.close()
        return {"candidate": cid, "tune": t.scope, "group": space["group"], "state": c.state,
                "note": "a candidate already on the board returns its first posting's id"
                if c.posted < before else "posted: the tune takes it in, gates and times it"}  # fmt: skip

    # --- internals -----------------------------------------------------------------------------------

    def _board(self) -> Board:
        if not self.board_path.is_file():
            raise UserError(
                f"no board at {self.board_path} yet: start `polymorph tune MODEL --wait-for-posts --board "
                f"{self.board_path}`, or pass `polymorph mcp --board` the board of a running tune"
            )
        return Board(self.board_path)

    def _tunes(self) -> list[LiveTune]:
        self._board().close()  # the same message when the file is missing
        live = LiveTunes(self.board_path)
        try:
            tunes = live.list()
        finally:
            live.close()
        if not tunes:
            raise UserError(f"no tune has published its groups on board {self.board_path} yet")
        return tunes

    def _tune(self, name: str | None) -> LiveTune:
        tunes = self._tunes()
        if name is None or name == "":
            running = [t for t in tunes if t.running]
            return (running or tunes)[0]
        if not isinstance(name, str):
            raise UserError(f"`tune` is a tune id from list_tunes, got {type(name).__name__}")
        for t in tunes:
            if t.scope == name:
                return t
        raise UserError(f"no tune `{name[:80]}` on this board; tunes: {', '.join(t.scope for t in tunes)}")

    def _space(self, t: LiveTune, group: str) -> dict[str, Any]:
        if not isinstance(group, str) or not group:
            raise UserError("`group` is a node group id from list_tunes, e.g. layers.0.mlp.down+residual")
        for space in t.spaces:
            if group == space["group"] or group in space["groups"]:
                return space
        known = ", ".join(s["group"] for s in t.spaces)
        raise UserError(f"no node group `{group[:80]}` to tune in {t.scope}; its groups: {known}")

    def _candidates(self) -> list[Candidate]:
        board = self._board()
        try:
            return board.candidates()
        finally:
            board.close()

    def _champion(self, t: LiveTune, space: dict[str, Any]) -> Any:
        from polymorph.search.registry import ChampionKey, Registry

        if self.registry_path is None or not Path(self.registry_path).is_file():
            raise UserError(f"no registry at {self.registry_path}: pass `polymorph mcp --registry FILE`")
        reg = Registry(self.registry_path)
        try:
            return reg.best(ChampionKey(space["signature"], t.bucket, t.profile, t.toolchain))
        finally:
            reg.close()

    def _tune_summary(self, t: LiveTune, cands: list[Candidate]) -> dict[str, Any]:
        return {"tune": t.scope, "model": t.model, "backend": t.backend, "target": t.profile, "bucket": t.bucket,
                "running": t.running, "left_s": max(0.0, round(t.ends_by - time.time(), 1)),
                "waits_for_posts": t.waits_for_posts,
                "groups": [_figures(t, s, cands) for s in t.spaces]}  # fmt: skip


def _bare(group: str) -> str:
    return group.split("@", 1)[0]


def _in_space(t: LiveTune, space: dict[str, Any], c: Candidate) -> bool:
    if c.backend != t.backend or c.target != t.profile or _bare(c.group) not in space["groups"]:
        return False
    return "@" not in c.group or c.group.split("@", 1)[1] == t.scope


def _best(t: LiveTune, space: dict[str, Any], cands: list[Candidate]) -> tuple[Candidate, Any] | None:
    passed = [(c, c.result) for c in cands if _in_space(t, space, c) and "@" in c.group
              and c.result is not None and c.result.ok]  # fmt: skip
    return min(passed, key=lambda cr: cr[1].measurements["median_s"], default=None)


def _figures(t: LiveTune, space: dict[str, Any], cands: list[Candidate]) -> dict[str, Any]:
    """A group's share of the step, its measured stock time (the tune's baseline candidate), the
    roofline floor the cost model gives, the gap (measured / floor) and the best time so far."""
    stock = [c for c in cands if _in_space(t, space, c) and "@" in c.group and c.agent == "baseline"]
    measured = next((c.result.measurements.get("median_s") for c in stock if c.result and c.result.ok), None)
    best = _best(t, space, cands)
    floor = space.get("floor_s")
    return {"group": space["group"], "signature": space["signature"], "pattern": space["pattern"],
            "same_signature_groups": len(space["groups"]), "share": round(space["share"], 4),
            "measured_s": measured, "floor_s": floor,
            "roofline_gap": round(measured / floor, 2) if measured and floor else None,
            "best_s": None if best is None else best[1].measurements.get("median_s"),
            "best_candidate": None if best is None else best[0].id}  # fmt: skip


def _verdict(c: Candidate) -> tuple[str, str | None]:
    """(passed | rejected | failed | pending, the gate or stage that said no)."""
    r = c.result
    if r is None:
        return "pending", None
    if r.ok:
        return "passed", None
    head = r.cause.split(":", 1)[0]
    if head in r.gates:  # the cause names the gate that said no first (tune.gate_cause)
        return "rejected", head
    said_no = [name for name, g in r.gates.items() if isinstance(g, dict) and g.get("ok") is False
               and g.get("verdict") != "not run"]  # fmt: skip
    return ("rejected", said_no[0]) if said_no else ("failed", head)


def _candidate_row(c: Candidate, full: bool = False) -> dict[str, Any]:
    verdict, gate = _verdict(c)
    r = c.result
    row = {"candidate": c.id, "agent": c.agent, "kind": c.kind, "config": c.config, "state": c.state,
           "verdict": verdict, "gate": gate, "cause": None if r is None else r.cause or None,
           "median_s": None if r is None or not r.ok else r.measurements.get("median_s"),
           "reasoning": c.reasoning if full else c.reasoning[:400]}  # fmt: skip
    if full and r is not None:
        row.update({"spread_s": r.measurements.get("spread_s"), "trials": r.measurements.get("trials"),
                    "gates": r.gates, "worker": r.worker, "claims": r.attempts})  # fmt: skip
    return row


def _library_text(kernel: str) -> dict[str, Any]:
    """A stock kernel's text and the shared modules it pins, read (never imported) from the library; a
    path that leaves the library (a forged tune row) is refused."""
    from polymorph.pipeline.kernel_files import kernels_root, pinned_sources

    root = kernels_root().resolve()
    path = (root / kernel).resolve()
    if (
        not isinstance(kernel, str)
        or not path.is_relative_to(root)
        or path.suffix != ".py"
        or not path.is_file()
    ):
        raise UserError(f"the stock kernel `{str(kernel)[:80]}` is not a file of polymorph's kernel library")
    text = path.read_text(encoding="utf-8")
    shared = [
        {"module": name, "sha256": sha, "source": t} for name, sha, t in pinned_sources(text, path.parent)
    ]
    return {"source": text, "shared_modules": shared}


def _int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UserError(f"`{what}` must be an integer from {low} to {high}, got {value!r}")
    return value


def _number(value: Any, what: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise UserError(f"`{what}` must be a number from {low:g} to {high:g}, got {value!r}")
    return float(value)
