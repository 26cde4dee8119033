"""What each class is for, read off the program's structure (not off the zoo's names).

- state inputs: arguments that the step returns updated (parameters, optimizer moments): an
  output with the same shape and dtype, matched in order. If the function returns none, the
  leaves of its first argument (a forward pass's parameters).
- batch: the class of the data inputs that touches no state and has the most bytes at stake.
- sequence: a data class other than batch that two data inputs share (tokens and labels); it
  may touch state (learned positions).
- width: the class on the most state values (the residual stream's `embed`): tensor
  parallelism leaves it alone, FSDP shards it first.
- tensor-parallel classes: state classes other than those, chosen greedily by bytes so that no
  parameter has two of them (Megatron: heads, MLP hidden, vocabulary — one per weight).
- FSDP classes: state classes chosen greedily, widest first then by the parameter bytes they
  cover, until every parameter has one (a bias's hidden dim, once the weights are covered).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..program import state_inputs
from ..rules import NEED_REPLICATION


@dataclass(frozen=True)
class Roles:
    state_inputs: frozenset[int]
    batch: int | None
    sequence: int | None
    width: int | None
    tensor_parallel: tuple[int, ...]
    fsdp: tuple[int, ...]

    def describe(self, an) -> dict[str, object]:
        name = lambda c: None if c is None else an.classes[c].name  # noqa: E731
        return {"batch": name(self.batch), "sequence": name(self.sequence),
                "width": name(self.width),
                "tensor_parallel": [name(c) for c in self.tensor_parallel],
                "fsdp": [name(c) for c in self.fsdp]}


def find_roles(an) -> Roles:
    prog = an.program
    state = state_inputs(prog)
    data = [v for v in prog.inputs if v not in state]
    vc = an.value_classes

    def classes_of(values):
        return {c for v in values for c in vc[v] if c >= 0}

    state_classes = classes_of(state)
    data_classes = classes_of(data)
    by_bytes = sorted(data_classes, key=lambda c: (-an.classes[c].bytes, c))
    batch = next((c for c in by_bytes if c not in state_classes), None)
    # A sequence runs from the inputs to the targets: tokens and labels share it (an MLP's
    # features, an image's height, stop at the first layer).
    shared = Counter(c for v in data for c in set(vc[v]) if c >= 0)
    sequence = next((c for c in by_bytes if c != batch and shared[c] >= 2), None)
    # The scanned dim of a layer stack: sharding it is pipelining, not FSDP or Megatron.
    loops = {c for op, rule, classes in zip(prog.ops, an.op_rules, an.op_factor_classes)
             if op.primitive == "scan"
             for c, kind in zip(classes, rule.kinds) if kind is NEED_REPLICATION and c >= 0}

    params_of: dict[int, set[int]] = {c: set() for c in state_classes}
    for v in state:
        for c in vc[v]:
            if c >= 0:
                params_of[c].add(v)
    width = max(params_of, key=lambda c: (len(params_of[c]), -c), default=None)

    skip = {batch, sequence, width} | loops
    candidates = sorted((c for c in state_classes if c not in skip),
                        key=lambda c: (-an.classes[c].bytes, c))
    taken: set[int] = set()
    tensor_parallel = []
    for c in candidates:
        if params_of[c].isdisjoint(taken):
            tensor_parallel.append(c)
            taken |= params_of[c]

    def param_bytes(c):
        return sum(prog.values[v].nbytes for v in params_of[c])

    covered: set[int] = set()
    fsdp = []
    for c in sorted((c for c in state_classes if c != batch and c not in loops),
                    key=lambda c: (c != width, -param_bytes(c), c)):
        if not params_of[c] <= covered:  # where two meet on a weight, the first decided wins
            fsdp.append(c)
            covered |= params_of[c]
    return Roles(state, batch, sequence, width, tuple(tensor_parallel), tuple(fsdp))
