"""Fusion: partition a graph's nodes into groups, each of which a backend may run as one kernel.

Fusion does not rewrite the graph — the op table is closed and the reference must still run it — it
returns `NodeGroup`s that a backend's plan maps to kernels. A group is either a match of a pattern
from a table the backend opts into, or a single node.

A pattern is data: a name (what a kernel file's `IMPLEMENTS` says) and a small DAG template of
ordered steps. Each `Step(name, op, inputs)` lists the node's inputs in order as references:

  "step" or "step:i"   the value (output i) of an earlier step of this pattern — an edge in the group
  "$name"              a value from outside the group; every use of one `$name` is the same value
  "_"                  any value from outside the group

A node may have more inputs than its step lists (a linear's bias): the rest count as "_". The two
inputs of a commutative op (COMMUTATIVE_OPS) match in either order. `many=True` makes a step match
every node that fits (at least one) — all the linears that read one norm; no subset is tried when
the whole set fails — and a later step may not refer to it. Every step after the first must refer to an earlier step or to a `$name` bound before
it, so the match grows along edges from the first step (the anchor). `outputs` names the steps whose
values may be read outside the group; the values of every other step must be read only inside it.

Matching is greedy: for each pattern in table order, for each node in graph order not yet grouped,
the first assignment found (candidates in graph order, backtracking over single steps) that meets
three conditions becomes a group: (1) the values each step refers to as outside the group are
produced outside it; (2) no value of a non-output step is read outside the group, by a node, a graph
output or a state update; (3) the graph stays acyclic when each group runs as a unit — no path leads
from the group's values, through nodes outside it (an earlier group counts as one unit), back into
it. Nodes left over become single-node groups whose `pattern` is their op.

Group ids are derived from node names, so they are stable across builds of one model: the name of
the group's first node (graph order), then `+` and, for each other node in graph order, its name
without the leading dotted components it shares with the first node's name, keeping at least its
last component (`layers.3.mlp.down` and `layers.3.mlp.residual` give `layers.3.mlp.down+residual`). A single-node group's id is its node's
name. Were an id taken already (node names that contain `+`), `#2`, `#3`, ... is appended.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from polymorph.errors import UserError
from polymorph.ir.graph import Graph, Node
from polymorph.ir.ops import OPS
from polymorph.ir.spec import verify

# Ops whose two inputs may be swapped: a template's `add(x, y)` also matches `add(y, x)`.
COMMUTATIVE_OPS = frozenset({"add", "mul"})

ANY = "_"


class PatternError(UserError):
    """A pattern template that breaks the template rules; the message names the pattern and step."""


@dataclass(frozen=True)
class Step:
    """One node of a pattern: `name` (local to the pattern), its `op`, its `inputs` as references."""

    name: str
    op: str
    inputs: tuple[str, ...]
    many: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))


@dataclass(frozen=True)
class Pattern:
    """A fusion pattern: its name, its steps in order (the first is the anchor), its output steps."""

    name: str
    steps: tuple[Step, ...]
    outputs: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        _check_pattern(self)

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)


@dataclass(frozen=True)
class NodeGroup:
    """Nodes that run together as one kernel.

    id: stable, from node names (see the module docstring); pattern: the pattern's name, or the op of
    a single-node group; nodes: node names in graph order; inputs: the values the group reads that
    are produced outside it (leaves included: params, state, inputs), in order of first read;
    outputs: the values it produces that are read outside it (by another group, as a graph output or
    as a state update), in order of definition; roles: for a pattern match, each step's name and the
    node(s) it matched, in step order (empty for a single-node group).
    """

    id: str
    pattern: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    roles: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def role(self, step: str) -> tuple[str, ...]:
        """The node(s) that matched `step` of the group's pattern."""
        for name, nodes in self.roles:
            if name == step:
                return nodes
        raise KeyError(f"group `{self.id}` ({self.pattern}) has no step `{step}`")


# --- the template rules ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ref:
    kind: str  # step | slot | any
    name: str = ""
    index: int = 0


def _parse_ref(text: str) -> _Ref:
    if text == ANY:
        return _Ref("any")
    if text.startswith("$"):
        return _Ref("slot", text[1:])
    name, colon, index = text.partition(":")
    if colon and not index.isdigit():
        raise ValueError(text)
    return _Ref("step", name, int(index) if colon else 0)


def _check_pattern(p: Pattern) -> None:
    def fail(where: str, fault: str) -> PatternError:
        return PatternError(f"pattern `{p.name}`: {where}: {fault}")

    if not p.name or not p.steps:
        raise fail("template", "needs a name and at least one step")
    if p.steps[0].many:
        raise fail(f"step `{p.steps[0].name}`", "the first step (the anchor) cannot be many=True")
    steps: dict[str, Step] = {}
    slots: set[str] = set()
    for step in p.steps:
        where = f"step `{step.name}`"
        if not step.name or step.name == ANY or step.name.startswith("$") or ":" in step.name:
            raise fail(where, "a step name must be non-empty, not `_`, and contain no `$` or `:`")
        if step.name in steps:
            raise fail(where, "step name is used twice")
        if step.op not in OPS:
            raise fail(where, f"unknown op `{step.op}`; the op table has: {', '.join(sorted(OPS))}")
        if len(step.inputs) > OPS[step.op].arity[1]:
            raise fail(
                where, f"lists {len(step.inputs)} inputs; `{step.op}` takes at most {OPS[step.op].arity[1]}"
            )
        anchored = False
        new_slots = set()
        for text in step.inputs:
            try:
                ref = _parse_ref(text)
            except ValueError:
                raise fail(where, f"input `{text}`: expected `step`, `step:<int>`, `$name` or `_`") from None
            if ref.kind == "step":
                if ref.name not in steps:
                    raise fail(where, f"input `{text}` names no earlier step")
                if steps[ref.name].many:
                    raise fail(
                        where, f"input `{text}` refers to a many=True step, which matches several nodes"
                    )
                anchored = True
            elif ref.kind == "slot":
                if not ref.name:
                    raise fail(where, "`$` needs a name")
                if ref.name in slots:
                    anchored = True
                else:
                    new_slots.add(ref.name)
        if step is not p.steps[0] and not anchored:
            raise fail(
                where, "refers to no earlier step and to no `$name` bound before it: nothing anchors it"
            )
        if step.many and new_slots:
            raise fail(where, f"a many=True step cannot bind new slots ({', '.join(sorted(new_slots))})")
        slots |= new_slots
        steps[step.name] = step
    for name in p.outputs:
        if name not in steps:
            raise fail(f"output `{name}`", "names no step")
    if not p.outputs:
        raise fail("outputs", "name at least one step whose values leave the group")


# --- the standard pattern table ----------------------------------------------------------------------

# An rmsnorm and every linear that reads it (q/k/v, gate/up, an MoE router): norm in a GEMM prologue.
RMSNORM_LINEAR = Pattern(
    "rmsnorm+linear",
    (
        Step("norm", "rmsnorm", ("$x", ANY)),
        Step("proj", "linear", ("norm", ANY), many=True),
    ),
    outputs=("norm", "proj"),
)

# SwiGLU input: gate and up linears of one activation, silu of the gate, times the up.
LINEAR_SILU_MUL = Pattern(
    "linear+silu*mul",
    (
        Step("gate", "linear", ("$x", ANY)),
        Step("act", "silu", ("gate",)),
        Step("up", "linear", ("$x", ANY)),
        Step("mul", "mul", ("act", "up")),
    ),
    outputs=("mul",),
)

# A linear whose only reader is a residual add: o-proj and down-proj with the add in the epilogue.
LINEAR_RESIDUAL = Pattern(
    "linear+residual",
    (
        Step("proj", "linear", (ANY, ANY)),
        Step("residual", "add", ("$residual", "proj")),
    ),
    outputs=("residual",),
)

_QKV_HEADS = (
    Step("q", "linear", ("$x", ANY)),
    Step("k", "linear", ("$x", ANY)),
    Step("v", "linear", ("$x", ANY)),
    Step("q_heads", "reshape", ("q",)),
    Step("k_heads", "reshape", ("k",)),
    Step("v_heads", "reshape", ("v",)),
)
_KV_WRITES = (
    Step("k_write", "kv_write", (ANY, "k_rope", "$block_table", "$positions")),
    Step("v_write", "kv_write", (ANY, "v_heads", "$block_table", "$positions")),
)

# Attention input of one layer: q/k/v linears, their head reshapes, rope on q and k, both cache writes.
QKV_ROPE_KV_WRITE = Pattern(
    "qkv+rope+kv_write",
    (
        *_QKV_HEADS,
        Step("q_rope", "rope", ("q_heads", "$positions")),
        Step("k_rope", "rope", ("k_heads", "$positions")),
        *_KV_WRITES,
    ),
    outputs=("q_rope", "k_write", "v_write"),
)

# The same with a per-head RMSNorm of q and k before rope (Qwen3).
QKV_NORM_ROPE_KV_WRITE = Pattern(
    "qkv+qk_norm+rope+kv_write",
    (
        *_QKV_HEADS,
        Step("q_norm", "rmsnorm", ("q_heads", ANY)),
        Step("k_norm", "rmsnorm", ("k_heads", ANY)),
        Step("q_rope", "rope", ("q_norm", "$positions")),
        Step("k_rope", "rope", ("k_norm", "$positions")),
        *_KV_WRITES,
    ),
    outputs=("q_rope", "k_write", "v_write"),
)

# The attention input with its RMSNorm folded into the q/k/v GEMV's prologue (batch-1 decode: the
# norm's statistics come from the one activation row the GEMV reads anyway).
RMSNORM_QKV_ROPE_KV_WRITE = Pattern(
    "rmsnorm+qkv+rope+kv_write",
    (
        Step("norm", "rmsnorm", ("$h", ANY)),
        Step("q", "linear", ("norm", ANY)),
        Step("k", "linear", ("norm", ANY)),
        Step("v", "linear", ("norm", ANY)),
        Step("q_heads", "reshape", ("q",)),
        Step("k_heads", "reshape", ("k",)),
        Step("v_heads", "reshape", ("v",)),
        Step("q_rope", "rope", ("q_heads", "$positions")),
        Step("k_rope", "rope", ("k_heads", "$positions")),
        *_KV_WRITES,
    ),
    outputs=("q_rope", "k_write", "v_write"),
)

# The SwiGLU MLP input with its RMSNorm folded in: norm, gate and up GEMVs, silu(gate) * up.
RMSNORM_LINEAR_SILU_MUL = Pattern(
    "rmsnorm+linear+silu*mul",
    (
        Step("norm", "rmsnorm", ("$h", ANY)),
        Step("gate", "linear", ("norm", ANY)),
        Step("act", "silu", ("gate",)),
        Step("up", "linear", ("norm", ANY)),
        Step("mul", "mul", ("act", "up")),
    ),
    outputs=("mul",),
)

# SwiGLU's product alone, where gate and up run as plain projections (a GPU prefill): one pass over the
# two activations instead of a silu kernel and a product kernel.
SILU_MUL = Pattern(
    "silu*mul",
    (
        Step("act", "silu", ("$gate",)),
        Step("mul", "mul", ("act", ANY)),
    ),
    outputs=("mul",),
)

# Table order decides overlaps: the attention-input patterns take q/k/v before rmsnorm+linear could
# take them with their norm, so rmsnorm+linear groups what is left (an MoE router and its norm; the
# lm_head and the final norm when every position's logits are computed). A backend that wants the
# norm in its q/k/v GEMM instead puts RMSNORM_LINEAR first.
STANDARD_PATTERNS: tuple[Pattern, ...] = (
    QKV_ROPE_KV_WRITE,
    QKV_NORM_ROPE_KV_WRITE,
    LINEAR_SILU_MUL,
    LINEAR_RESIDUAL,
    RMSNORM_LINEAR,
    # Norm-folded variants last: they match only where a backend selects them ahead of the above.
    RMSNORM_QKV_ROPE_KV_WRITE,
    RMSNORM_LINEAR_SILU_MUL,
    SILU_MUL,
)


def select_patterns(
    names: Iterable[str], table: Sequence[Pattern] = STANDARD_PATTERNS
) -> tuple[Pattern, ...]:
    """The patterns of `table` named by `names`, in the order of `names`; UserError for an unknown name."""
    by_name = {p.name: p for p in table}
    out = []
    for name in names:
        if name not in by_name:
            raise UserError(f"no fusion pattern `{name}`; the table has: {', '.join(by_name)}")
        out.append(by_name[name])
    return tuple(out)


# --- matching ----------------------------------------------------------------------------------------


def fuse(graph: Graph, patterns: Sequence[Pattern], *, verified: bool = False) -> list[NodeGroup]:
    """Partition the nodes of `graph` into groups: pattern matches, in table order, then (for a program
    imported from torch.export) general groups (fuse_general.py), then single nodes.

    Every node is in exactly one group; running the groups' nodes group by group, in the order of the
    returned list, is a valid topological order of the graph (ties go to the group whose first node
    comes first). The graph must verify (GraphError otherwise; not checked again when the caller says
    it is `verified`); it is not changed.
    """
    if not verified:
        verify(graph)
    matcher = _Matcher(graph)
    for pattern in patterns:
        if not isinstance(pattern, Pattern):
            raise TypeError(f"fuse() takes Pattern objects, got {pattern!r}")
        for node in graph.nodes:
            if node.name in matcher.unit_of or node.op != pattern.steps[0].op:
                continue
            roles = matcher.match(pattern, node.name)
            if roles is not None:
                matcher.add_unit(pattern.name, roles)
    if graph.meta.get("source") == "torch.export":
        # An imported program's general ops: elementwise chains and reductions, one group each.
        from polymorph.passes.fuse_general import general_groups

        for group in general_groups(graph, taken=matcher.unit_of):
            matcher.add_unit(group.pattern, {})
            for name in group.nodes:
                matcher.assign(name)
    for node in graph.nodes:
        if node.name not in matcher.unit_of:
            matcher.add_unit(node.op, {})
            matcher.assign(node.name)
    return matcher.groups()


Roles = dict[str, tuple[str, ...]]


class _Matcher:
    """The graph's def-use tables and the units (groups) formed so far."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: dict[str, Node] = {n.name: n for n in graph.nodes}
        self.index: dict[str, int] = {n.name: i for i, n in enumerate(graph.nodes)}
        self.producer: dict[str, str] = {v: n.name for n in graph.nodes for v in n.outputs}
        self.consumers: dict[str, list[str]] = {}
        for n in graph.nodes:
            for value in dict.fromkeys(n.inputs):
                self.consumers.setdefault(value, []).append(n.name)
        self.sinks = set(graph.outputs.values()) | set(graph.state_updates.values())
        self.unit_of: dict[str, int] = {}
        self.members: list[list[str]] = []
        self.patterns: list[str] = []
        self.roles: list[Roles] = []

    # --- units

    def add_unit(self, pattern: str, roles: Roles) -> None:
        self.members.append([])
        self.patterns.append(pattern)
        self.roles.append(roles)
        for names in roles.values():
            for name in names:
                self.assign(name)

    def assign(self, name: str) -> None:
        self.unit_of[name] = len(self.members) - 1
        self.members[-1].append(name)

    # --- the search

    def match(self, pattern: Pattern, anchor: str) -> Roles | None:
        return self._extend(pattern, 0, {}, {}, anchor)

    def _extend(
        self, pattern: Pattern, i: int, roles: Roles, slots: dict[str, str], anchor: str
    ) -> Roles | None:
        if i == len(pattern.steps):
            return roles if self._acceptable(pattern, roles) else None
        step = pattern.steps[i]
        taken = {n for names in roles.values() for n in names}
        candidates = [anchor] if i == 0 else self._candidates(step, roles, slots)
        fits = []
        for name in candidates:
            if name in taken or name in self.unit_of:
                continue
            for bound in self._bind(step, self.nodes[name], roles, slots):
                if step.many:
                    fits.append(name)
                    break
                found = self._extend(pattern, i + 1, {**roles, step.name: (name,)}, bound, anchor)
                if found is not None:
                    return found
        if fits:
            return self._extend(pattern, i + 1, {**roles, step.name: tuple(fits)}, slots, anchor)
        return None

    def _candidates(self, step: Step, roles: Roles, slots: Mapping[str, str]) -> list[str]:
        """Nodes that read the value of the first input that is already known: a step or a bound slot."""
        for text in step.inputs:
            ref = _parse_ref(text)
            if ref.kind == "step":
                outs = self.nodes[roles[ref.name][0]].outputs
                return self.consumers.get(outs[ref.index], []) if ref.index < len(outs) else []
            if ref.kind == "slot" and ref.name in slots:
                return self.consumers.get(slots[ref.name], [])
        raise AssertionError(f"step `{step.name}` has no anchor (Pattern checks this)")

    def _bind(
        self, step: Step, node: Node, roles: Roles, slots: Mapping[str, str]
    ) -> Iterator[dict[str, str]]:
        """The slot bindings under which `node` fits `step` (one per input order that fits)."""
        if node.op != step.op or len(node.inputs) < len(step.inputs):
            return
        orders = [node.inputs]
        if node.op in COMMUTATIVE_OPS and len(node.inputs) == 2:
            orders.append(node.inputs[::-1])
        for values in orders:
            bound = dict(slots)
            ok = True
            for text, value in zip(step.inputs, values):
                ref = _parse_ref(text)
                if ref.kind == "step":
                    outs = self.nodes[roles[ref.name][0]].outputs
                    ok = ref.index < len(outs) and outs[ref.index] == value
                elif ref.kind == "slot":
                    ok = bound.setdefault(ref.name, value) == value
                if not ok:
                    break
            if ok:
                yield bound

    def _acceptable(self, pattern: Pattern, roles: Roles) -> bool:
        members = {n for names in roles.values() for n in names}
        produced = {v for n in members for v in self.nodes[n].outputs}
        for step in pattern.steps:
            internal = sum(_parse_ref(t).kind == "step" for t in step.inputs)
            for name in roles[step.name]:
                node = self.nodes[name]
                # Inputs the template calls outside (`$x`, `_`, unlisted) must not come from the group.
                if sum(v in produced for v in node.inputs) != internal:
                    return False
                if step.name not in pattern.outputs and any(self._visible(v, members) for v in node.outputs):
                    return False
        return not self._closes_cycle(members)

    def _visible(self, value: str, members: set[str]) -> bool:
        """Whether `value` is read outside `members`: by another node, as a graph output or a state update."""
        return value in self.sinks or any(c not in members for c in self.consumers.get(value, []))

    def _closes_cycle(self, members: set[str]) -> bool:
        """Whether a path leaves `members` and comes back through outside nodes (a unit counts as one)."""
        stack = [
            c
            for n in members
            for v in self.nodes[n].outputs
            for c in self.consumers.get(v, [])
            if c not in members
        ]
        seen: set[str | int] = set()
        while stack:
            name = stack.pop()
            if name in members:
                return True
            unit = self.unit_of.get(name)
            key: str | int = name if unit is None else unit
            if key in seen:
                continue
            seen.add(key)
            group = [name] if unit is None else self.members[unit]
            for n in group:
                for value in self.nodes[n].outputs:
                    stack.extend(c for c in self.consumers.get(value, []) if c not in group)
        return False

    # --- the result

    def groups(self) -> list[NodeGroup]:
        count = len(self.members)
        first = [min(self.index[n] for n in members) for members in self.members]
        preds: list[set[int]] = [set() for _ in range(count)]
        succs: list[set[int]] = [set() for _ in range(count)]
        for unit, members in enumerate(self.members):
            for name in members:
                for value in self.nodes[name].inputs:
                    src = self.producer.get(value)
                    if src is not None and self.unit_of[src] != unit:
                        preds[unit].add(self.unit_of[src])
                        succs[self.unit_of[src]].add(unit)
        ready = [(first[u], u) for u in range(count) if not preds[u]]
        heapq.heapify(ready)
        order = []
        while ready:
            _, unit = heapq.heappop(ready)
            order.append(unit)
            for s in succs[unit]:
                preds[s].discard(unit)
                if not preds[s]:
                    heapq.heappush(ready, (first[s], s))
        if len(order) != count:
            raise AssertionError("fusion produced a cyclic partition (the cycle check should prevent it)")
        ids: set[str] = set()
        return [self._group(unit, ids) for unit in order]

    def _group(self, unit: int, ids: set[str]) -> NodeGroup:
        names = sorted(self.members[unit], key=self.index.__getitem__)
        member_set = set(names)
        produced = {v for n in names for v in self.nodes[n].outputs}
        inputs = dict.fromkeys(v for n in names for v in self.nodes[n].inputs if v not in produced)
        outputs = [v for n in names for v in self.nodes[n].outputs if self._visible(v, member_set)]
        gid = _group_id(names)
        base, k = gid, 1
        while gid in ids:
            k += 1
            gid = f"{base}#{k}"
        ids.add(gid)
        return NodeGroup(
            id=gid,
            pattern=self.patterns[unit],
            nodes=tuple(names),
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            roles=tuple((step, nodes) for step, nodes in self.roles[unit].items()),
        )


def _group_id(names: Sequence[str]) -> str:
    head = names[0].split(".")
    parts = [names[0]]
    for name in names[1:]:
        tail = name.split(".")
        shared = 0
        while shared < min(len(head), len(tail) - 1) and head[shared] == tail[shared]:
            shared += 1
        parts.append(".".join(tail[shared:]))
    return "+".join(parts)
