"""What each class is for, read off the program's structure (not off the zoo's names, nor off
any library's parameter paths: Keras's lists of variables, haiku's `module/~/submodule` dicts
and equinox's modules with `None` leaves all look the same here).

- state inputs: arguments that the step returns updated (parameters, optimizer moments): an
  output with the same shape and dtype, matched in order. If the function returns none, the
  leaves of its first argument (a forward pass's parameters). Scalars are never state.
- data inputs: every other argument leaf (tokens, labels, images, masks, PRNG keys).
- batch: the *leading* dim of the data inputs — data parallelism splits examples, and every
  library puts the example dim first. Each data input votes with its bytes for the class of its
  dim 0 (dim 1 where dim 0 is the scanned dim of a `lax.scan`, as in time-major inputs); a class
  that touches state cannot be the batch. Not the class with the most bytes: a sequence or an
  image's height often has more. A batch split into micro-batches that a `lax.scan` runs one
  at a time (gradient accumulation: `tokens.reshape(micro, -1, seq)`) votes for the examples
  within a micro-batch, the dim after the scanned one: that is what data parallelism splits;
  the inputs' own leading dims (`micro_batched`) are sharded like it, as a data loader hands
  each device its share of the global batch.
- sequence: a data class other than batch that two data inputs share (tokens and labels), or
  two shifted copies of one (labels made inside the step: `tokens[:, :-1]` and `tokens[:, 1:]`,
  `jnp.roll(tokens, -1, 1)`: slices, pads and concatenations of a data input along a dim each
  count as a copy of it); it may touch state (learned positions).
- feature classes: classes on a result dim of a contraction (dot_general, a convolution, a
  grouped matmul) that is not contracted there — what tensor parallelism can split: a
  layer's output features or channels, attention heads, the vocabulary. A convolution's window
  dims and a dead input's own dims are never among them.
- width: the feature class on the most state values (the residual stream's `embed`, a
  convnet's widest channel stage), among those on more than two weight matrices (an MLP's
  hidden dim, out of one layer and into the next, is what Megatron splits; a plain MLP or
  convnet has no width): tensor parallelism leaves it alone, FSDP shards it first.
- tensor-parallel classes: feature classes of state other than batch, sequence and width,
  chosen greedily by bytes so that no parameter has two of them (Megatron: heads, MLP hidden,
  vocabulary — one per weight; a conv's output channels, which are the next conv's input
  channels).
- FSDP classes: state classes chosen greedily, widest first then by the parameter bytes they
  cover, until every parameter has one (a bias's hidden dim, once the weights are covered).
- loops: the scanned dims of `lax.scan`s (a stack of layers, or the micro-batches of gradient
  accumulation): sharding one is pipelining, never FSDP or Megatron.

The analysis finds the roles once (`Analysis.roles`); its class names and the expert strategies
both read them there.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from ._domains import domains
from ..program import state_inputs
from ..rules import NEED_REPLICATION, PASS_THROUGH

# Ops whose free (non-contracted) result dims are features that tensor parallelism splits.
CONTRACTIONS = frozenset({"dot_general", "conv_general_dilated", "ragged_dot_general"})
# Ops that make a shifted or cut copy of a data input, dim for dim (labels made from the tokens
# inside the step), and ops that only pass a copy on (casts).
_SHIFTS = frozenset({"slice", "dynamic_slice", "pad", "concatenate", "rev"})
_CASTS = frozenset({"convert_element_type", "copy", "reduce_precision"})


@dataclass(frozen=True)
class Roles:
    state_inputs: frozenset[int]
    batch: int | None
    sequence: int | None
    width: int | None
    tensor_parallel: tuple[int, ...]
    fsdp: tuple[int, ...]
    micro_batched: tuple[int, ...] = ()  # the data inputs' leading dims split into `batch`
    loops: frozenset[int] = frozenset()  # the scanned dims of `lax.scan`s

    def describe(self, an) -> dict[str, object]:
        name = lambda c: None if c is None else an.classes[c].name  # noqa: E731
        return {"batch": name(self.batch), "sequence": name(self.sequence),
                "micro_batched": [name(c) for c in self.micro_batched],
                "width": name(self.width),
                "tensor_parallel": [name(c) for c in self.tensor_parallel],
                "fsdp": [name(c) for c in self.fsdp]}


def find_roles(an) -> Roles:
    """The roles of `an`'s classes (see the module docstring), found once per analysis."""
    return an.derived("roles", lambda: _find_roles(an))


def _find_roles(an) -> Roles:
    prog = an.program
    state = state_inputs(prog)
    data = [v for v in prog.inputs if v not in state]
    vc = an.value_classes

    def classes_of(values):
        return {c for v in values for c in vc[v] if c >= 0}

    state_classes = classes_of(state)
    # The scanned dim of a layer stack: sharding it is pipelining, not FSDP or Megatron.
    loops = {c for op, rule, classes in zip(prog.ops, an.op_rules, an.op_factor_classes)
             if op.primitive == "scan"
             for c, kind in zip(classes, rule.kinds) if kind is NEED_REPLICATION and c >= 0}
    batch, micro_batched = _batch(an, data, state_classes, loops)
    # A sequence runs from the inputs to the targets: tokens and labels share it (an MLP's
    # features, an image's height, stop at the first layer).
    shared = _copies(an, data)
    by_bytes = sorted(shared, key=lambda c: (-an.classes[c].bytes, c))
    sequence = next((c for c in by_bytes if c != batch and shared[c] >= 2), None)
    features = feature_classes(an)

    params_of: dict[int, set[int]] = {c: set() for c in state_classes}
    for v in state:
        for c in vc[v]:
            if c >= 0:
                params_of[c].add(v)
    # The width is a stream many weights read and write (a transformer's embed: every
    # projection in and out of it). A class on two weight matrices only (an MLP's hidden,
    # out of one layer and into the next) is the pair Megatron splits, not a stream.
    weights = domains(an).parameters
    matrices = {c: sum(1 for v in params_of[c] if v in weights and prog.values[v].ndim >= 2)
                for c in params_of}
    width = max((c for c in params_of if c in features and c != batch and matrices[c] > 2),
                key=lambda c: (len(params_of[c]), -c), default=None)

    skip = {batch, sequence, width} | loops
    candidates = sorted((c for c in state_classes if c not in skip and c in features),
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
    micro_batched = tuple(sorted(c for c in micro_batched
                                 if c != batch and c not in state_classes))
    return Roles(state, batch, sequence, width, tuple(tensor_parallel), tuple(fsdp),
                 micro_batched, frozenset(loops))


def _copies(an, data) -> Counter:
    """Per class, how many copies of the data inputs carry it: each data input, and each
    shifted or cut copy of one made by a slice, pad or concatenation along its dims (through
    casts), counts once for each class on its dims."""
    prog, vc = an.program, an.value_classes
    count: Counter = Counter()
    frontier, seen = list(data), set(data)
    while frontier:
        v = frontier.pop()
        for c in set(vc[v]):
            if c >= 0:
                count[c] += 1
        for o in prog.users(v):
            op = prog.ops[o]
            if op.primitive in _SHIFTS or op.primitive in _CASTS:
                for r in op.results:
                    if r not in seen and prog.values[r].ndim == prog.values[v].ndim:
                        seen.add(r)
                        frontier.append(r)
    # a cast is the same copy: count the classes of what it casts only once
    return count - _cast_repeats(an, seen)


def _cast_repeats(an, copies) -> Counter:
    prog, vc = an.program, an.value_classes
    out: Counter = Counter()
    for v in copies:
        val = prog.values[v]
        if val.producer >= 0 and prog.ops[val.producer].primitive in _CASTS:
            for c in set(vc[v]):
                if c >= 0:
                    out[c] += 1
    return out


def _batch(an, data, state_classes, loops) -> tuple[int | None, set[int]]:
    """(the class of the data inputs' leading dim, by bytes voted; the leading classes that
    are split into micro-batches of it) (see the module docstring)."""
    prog = an.program
    votes: dict[int, int] = defaultdict(int)
    split: dict[int, set[int]] = defaultdict(set)
    for v in data:
        dims = an.value_classes[v]
        lead = [c for c in dims[:2]]
        if lead and lead[0] in loops and len(lead) > 1:  # time-major: [T, B, ...]
            lead = lead[1:]
        if lead and lead[0] >= 0 and lead[0] not in state_classes and lead[0] not in loops:
            inner = _micro_batches(an, v, loops)
            if inner is not None:
                split[inner].add(lead[0])
                lead = [inner]
            votes[lead[0]] += max(prog.values[v].nbytes, 1)
    if votes:
        batch = max(votes, key=lambda c: (votes[c], -c))
        return batch, split[batch]
    # No data input has a usable leading dim: the data class with the most bytes at stake.
    data_classes = {c for v in data for c in an.value_classes[v] if c >= 0}
    return next((c for c in sorted(data_classes, key=lambda c: (-an.classes[c].bytes, c))
                 if c not in state_classes and c not in loops), None), set()


def _micro_batches(an, v: int, loops) -> int | None:
    """The class of the examples within a micro-batch where data input `v` is reshaped into
    [micro-batches (a scanned dim), examples, ...]; None where it is not."""
    prog = an.program
    n = prog.values[v].shape[0]
    for op in prog.users(v):
        op = prog.ops[op]
        if op.primitive != "reshape":
            continue
        r = prog.values[op.results[0]]
        classes = an.value_classes[r.id]
        if (r.ndim >= 2 and r.shape[0] * r.shape[1] == n and classes[0] in loops
                and classes[1] >= 0):
            return int(classes[1])
    return None


def feature_classes(an) -> frozenset[int]:
    """Classes on a pass-through result dim of a contraction (see the module docstring)."""
    out = set()
    for op, rule, classes in zip(an.program.ops, an.op_rules, an.op_factor_classes):
        if op.primitive not in CONTRACTIONS or rule.fallback:
            continue
        on_result = {f for t in rule.results for dim in t for f in dim}
        out.update(classes[f] for f in on_result
                   if rule.kinds[f] is PASS_THROUGH and classes[f] >= 0)
    return frozenset(out)
