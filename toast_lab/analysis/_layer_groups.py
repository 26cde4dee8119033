"""Layer groups: the parts of a training step's forward pass that a remat decision covers.

A step traced through `jax.grad` holds its forward pass (JAX wraps the name stacks of its ops
in `jvp(...)`), its backward pass (`transpose(jvp(...))`) and what surrounds them (the
optimizer's update, which is neither). What the forward pass computes and the backward pass
reads again — its residuals — is what remat trades for recomputation. The groups follow the
layers the analysis already folds together (_layers.py; the Lab's scope tree folds the same):

- a **scanned** stack (`lax.scan` over layers): one unit, the forward scan op; its backward
  is the transposed scan that reads its residual stacks. Named by its body's top-level scope
  (`block`), or `scan<N>` where the body has none.
- **unrolled** repeated layers: top-level scopes that differ only by a layer index (`block0`,
  `block1`, ...) form one group, `block*`, with one unit per layer.
- any other top-level **scope** of the forward pass (`embed`, `unembed`, `loss`): one unit.

A unit's ops are top-level ops of the forward pass (a region op stands for its body). Ops the
user put in no named scope belong to no group, and nothing of the backward pass or the update
does. `checkpointed`: the user's own `jax.checkpoint` covers the group: its backward pass holds
the checkpoint's recomputation (ops inlined from a remat with `prevent_cse`, `Op.cse_group`;
JAX emits the checkpointed function's forward pass as plain ops).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from ..program import NO_OP

FORWARD, BACKWARD, OUTSIDE = "forward", "backward", "outside"
SCANNED, LAYERS, SCOPE = "scanned", "layers", "scope"

_INDEXED = re.compile(r"^(.*?)(\d+)$")


@dataclass(frozen=True)
class LayerGroup:
    """One group a remat policy applies to (see the module docstring).

    name: what a plan pins (`remat@block*`). kind: SCANNED, LAYERS or SCOPE. units: per layer,
    its top-level forward op ids (a scanned group: the forward scan op). backward_scans: for a
    scanned group, per unit, the transposed scan that reads its residual stacks (NO_OP where
    none does). layers: how many layers the group covers (a scan's length). checkpointed: the
    user's own jax.checkpoint covers it. source: the user's source line of its first op.
    """

    name: str
    kind: str
    units: tuple[tuple[int, ...], ...]
    layers: int
    checkpointed: bool
    source: str
    backward_scans: tuple[int, ...] = ()

    def __repr__(self) -> str:
        user = ", jax.checkpoint" if self.checkpointed else ""
        return f"LayerGroup({self.name!r}: {self.kind} x{self.layers}{user}, {self.source})"


def dot_without_batch_dims(op) -> bool:
    """A matmul with no batch dims: what `jax.checkpoint_policies.dots_with_no_batch_dims_saveable`
    lets a remat keep (a projection's result; not attention's scores)."""
    if op.primitive != "dot_general":
        return False
    (_, _), (lhs_batch, rhs_batch) = op.params["dimension_numbers"]
    return not lhs_batch and not rhs_batch


def ad_pass(op) -> str:
    """FORWARD, BACKWARD or OUTSIDE: which pass of a differentiated step a top-level op is in,
    from the transformations JAX names its name stack after (through the calls inlined around
    it: a jax.checkpoint's recomputation records its own stack relative to the call)."""
    stack = op.name_stack
    if "transpose(" in stack:
        return BACKWARD
    return FORWARD if "jvp(" in stack else OUTSIDE


def passes(program) -> tuple[str, ...]:
    """ad_pass of every op; an op in a region body is in its outermost region's pass."""
    out: list[str] = []
    for op in program.ops:
        out.append(ad_pass(op) if op.region == NO_OP else out[_outermost(program, op)])
    return tuple(out)


def _outermost(program, op) -> int:
    while op.region != NO_OP:
        op = program.ops[op.region]
    return op.id


def layer_groups(an) -> tuple[LayerGroup, ...]:
    """The layer groups of `an`'s program, in the order their first ops run (found once)."""
    return an.derived("layer_groups", lambda: _find_groups(an.program))


def _find_groups(prog) -> tuple[LayerGroup, ...]:
    of = passes(prog)
    top = [op for op in prog.ops if op.region == NO_OP and of[op.id] == FORWARD]
    groups: list[LayerGroup] = []
    scans = [op for op in top if op.primitive == "scan"]
    for n, op in enumerate(scans):
        name = _scan_name(prog, op) or f"scan{n}"
        backward = _backward_scan(prog, op, of)
        checkpointed = backward != NO_OP and any(
            b.cse_group for b in prog.ops[slice(*prog.ops[backward].body_ops)])
        groups.append(LayerGroup(name, SCANNED, ((op.id,),), int(op.params["length"]),
                                 checkpointed, op.source, (backward,)))
    recomputed = {op.user_scope.split("/")[0] for op in prog.ops
                  if op.region == NO_OP and op.cse_group and of[op.id] == BACKWARD}
    by_scope: dict[str, list[int]] = defaultdict(list)
    for op in top:
        head = op.user_scope.split("/")[0]
        if op.primitive != "scan" and head:
            by_scope[head].append(op.id)
    indexed: dict[str, dict[int, str]] = defaultdict(dict)
    for head in by_scope:
        m = _INDEXED.match(head)
        if m and m.group(1):
            indexed[m.group(1)][int(m.group(2))] = head
    layered = {head: base for base, heads in indexed.items() if len(heads) > 1
               for head in heads.values()}
    taken = {g.name for g in groups}
    for base, heads in indexed.items():
        if len(heads) < 2:
            continue
        units = tuple(tuple(by_scope[heads[i]]) for i in sorted(heads))
        groups.append(_group(prog, _unique(f"{base}*", taken), LAYERS, units,
                             any(h in recomputed for h in heads.values())))
    for head, ops in by_scope.items():
        if head not in layered:
            groups.append(_group(prog, _unique(head, taken), SCOPE, (tuple(ops),),
                                 head in recomputed))
    return tuple(sorted(groups, key=lambda g: g.units[0][0]))


def _group(prog, name: str, kind: str, units, checkpointed: bool) -> LayerGroup:
    first = prog.ops[units[0][0]]
    return LayerGroup(name, kind, units, len(units), checkpointed, first.source)


def _unique(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out


def _scan_name(prog, op) -> str:
    """The top-level scope the scan's body ops share most (under the scan's own scope)."""
    count: dict[str, int] = defaultdict(int)
    own = [c for c in op.user_scope.split("/") if c]
    for body_op in prog.ops[op.body_ops[0]:op.body_ops[1]]:
        parts = [c for c in body_op.user_scope.split("/") if c]
        if parts[:len(own)] == own and len(parts) > len(own):
            count["/".join(own + [parts[len(own)]])] += 1
    return max(count, key=lambda k: (count[k], k)) if count else "/".join(own)


def _backward_scan(prog, op, of) -> int:
    """The backward-pass scan that reads the forward scan's stacked results (its residuals)."""
    stacks = op.results[op.params["num_carry"]:]
    readers = {u for r in stacks for u in prog.users(r)
               if prog.ops[u].primitive == "scan" and of[u] == BACKWARD
               and prog.ops[u].region == NO_OP}
    return min(readers) if len(readers) == 1 else NO_OP

