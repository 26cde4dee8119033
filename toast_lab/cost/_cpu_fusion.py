"""XLA:CPU's own fusion decisions: which cheap producers its InstructionFusion clones into
several consumer fusions (so cost_analysis() counts them once per copy), which elementwise ops
are fusions of their own, and which values its YNNPACK library fusions read from memory.

Built from the program alone (plan-independent); the cost model applies them where the device's
compiler profile says its compiler clones fused producers (_compiler.py). The fusion every XLA
backend does (loop fusion, attention kernels) is _fusion.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..program import CONST, LITERAL, NO_OP
from ._fusion import fusible, is_reduction

# Elementwise ops XLA:CPU's fusion will not duplicate into several consumers
# (CpuInstructionFusion::IsExpensive): transcendentals, float division and remainder, powers,
# and the ops expanded around one.
EXPENSIVE = frozenset({
    "exp", "exp2", "expm1", "log", "log1p", "sqrt", "rsqrt", "cbrt", "tanh", "logistic", "erf",
    "erfc", "erf_inv", "pow", "atan2", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
    "atanh", "lgamma", "digamma", "div", "rem",
    # jax's threefry2x32 on XLA:CPU: a loop over its rounds, computed once
    "random_bits",
})
_SPREAD = frozenset({"broadcast_in_dim", "iota"})
# Of those, the expansions that end in cheap arithmetic after their expensive ops (erf_inv: a
# log, a sqrt, then polynomials): the expensive head runs once, a fusion of its own, and the
# cheap tail is cloned into every fusion that reads the op (its flops: _flops.py's
# _CLONED_FLOPS).
CLONED_TAIL = frozenset({"erf_inv", "erfc", "lgamma", "digamma", "asin", "sinh", "cosh",
                         "asinh", "acosh", "atanh"})


def fusion_copies(prog) -> np.ndarray:
    """[N] how many copies of each op XLA:CPU's InstructionFusion emits (1 for most ops).

    XLA fuses consumers first and clones a producer into every fusion that reads it, so a cheap
    elementwise op read by k fusions runs (and cost_analysis() counts it) k times. The rules
    of instruction_fusion.cc and cpu_instruction_fusion.cc: an expensive op (EXPENSIVE, and
    reductions) is never cloned, so with several consumer fusions it is a fusion of its own;
    an op also read by a non-fusible op, an output or another region is computed once for
    those plus a clone per fusible consumer, but only when it is effectively unary (at most
    one operand of its rank that is not a broadcast) or reads no more elements than it writes
    (ComputeGloballyUnfusible); otherwise it is not fused at all. A division by a constant
    is cheap: XLA's algebraic simplifier makes it a multiplication by the reciprocal. Copies
    are distinct consumer fusions: two readers fused into one fusion share a clone.

    XLA:CPU runs large reductions as YNNPACK custom fusions (_ynn_reduction), which
    InstructionFusion does not fuse into: to it they are non-fusible readers. Not followed:
    those custom fusions also take in some elementwise producers of the reduction (which are
    then not cloned either), and, the count being plan-independent, a collective the
    partitioner puts between producer and consumer, which also stops the clone.
    """
    tails: dict = {}
    fusions = _consumer_fusions(prog, tails)
    return np.array([tails.get(i, len(f)) for i, f in enumerate(fusions)], np.float64)


def own_fusions(prog) -> np.ndarray:
    """[N] bool: elementwise ops XLA:CPU's InstructionFusion runs as a fusion of their own
    rather than inside their readers' (an expensive op, a tanh or an exp, read by several
    fusions: see fusion_copies). Their results are written to memory, even where only
    fusible ops read them."""
    fusions = _consumer_fusions(prog)
    return np.array([fusible(op) and not is_reduction(op.primitive) and bool(op.results)
                     and any(prog.users(r) for r in op.results) and fusions[op.id] == (op.id,)
                     for op in prog.ops])


def _consumer_fusions(prog, tails: dict | None = None) -> list:
    """Per op, the fusions its copies land in (the ids of their roots): fusion_copies. tails,
    where given, gets {op id: fusions its cloned tail lands in} of the CLONED_TAIL ops that
    are fusions of their own."""
    ops = prog.ops
    outputs = set(prog.outputs)
    fusions: list = [None] * len(ops)  # the fusions an op's clones land in (ids of their roots)
    unfusible_path = _fused_on_no_path(prog)
    for op in reversed(ops):
        if not fusible(op) or is_reduction(op.primitive):
            fusions[op.id] = (op.id,)
            continue
        into, own = set(), unfusible_path[op.id]
        for r in op.results:
            own |= r in outputs
            for u in prog.users(r):
                if (ops[u].region != op.region or not fusible(ops[u])
                        or _ynn_reduction(prog, ops[u])):
                    own = True
                else:
                    into.update(fusions[u])
        expensive = op.primitive in EXPENSIVE and not (
            op.primitive == "div" and _constant(prog, op.operands[-1]))
        if (expensive and len(into) + own > 1) or (own and not _may_duplicate(prog, op)):
            if tails is not None and expensive and op.primitive in CLONED_TAIL:
                tails[op.id] = len(into) + own
            into = set()
        if own or not into:
            into.add(op.id)
        fusions[op.id] = tuple(sorted(into))
    return fusions


def _may_duplicate(prog, op) -> bool:
    """Whether cloning `op` into several fusions reads no more than computing it once
    (instruction_fusion.cc, ComputeGloballyUnfusible): it is effectively unary (at most one
    operand of its true rank, dims of size 1 not counted, that is not a broadcast, an iota
    or a constant; an operand the jaxpr broadcasts implicitly along size-1 dims is a
    broadcast in XLA's HLO), or its operands have no more elements than its results."""
    values, ops = prog.values, prog.ops
    numel = lambda v: int(np.prod(values[v].shape, dtype=np.int64))  # noqa: E731
    rank = max((_true_rank(values[r].shape) for r in op.results), default=0)
    wide = sum(1 for u in op.operands if _true_rank(values[u].shape) >= rank > 0
               and not (values[u].producer != NO_OP
                        and ops[values[u].producer].primitive in _SPREAD))
    return wide <= 1 or (sum(numel(u) for u in set(op.operands))
                         <= sum(numel(r) for r in op.results))


def _true_rank(shape) -> int:
    """The dims of more than one element (XLA's ShapeUtil::TrueRank)."""
    return sum(1 for d in shape if d > 1)


def _fused_on_no_path(prog) -> np.ndarray:
    """[N] bool: ops XLA's InstructionFusion will not clone because they read more than they
    write (not _may_duplicate) and a reader of theirs also reads, through another path, a
    value made from them by an op nothing fuses (a dot, a reduction): XLA clones such an op
    only where it can fuse it into every reader on all paths (CanFuseOnAllPaths). In a
    training step a forward product read again in the backward pass next to a gradient
    (silu(gate) = gate * sigmoid(gate), read by the up projection's weight gradient as
    g * silu, g computed from it through the down projection) is such an op: XLA writes it
    once, a fusion of its own, and keeps it for the backward pass (a Keras-Hub Mixtral's
    expert MLPs, jax 0.10.2).

    One sweep in program order with a bit per candidate: `reach[v]`, the candidates v is
    made from; `past[v]`, those it is made from through an op nothing fuses."""
    values, ops = prog.values, prog.ops
    bit = {}
    for op in ops:
        if fusible(op) and not is_reduction(op.primitive) and op.results \
                and not _may_duplicate(prog, op):
            bit[op.id] = 1 << len(bit)
    blocked = np.zeros(len(ops), bool)
    if not bit:
        return blocked
    reach, past = [0] * len(values), [0] * len(values)
    for op in ops:
        into = past_into = 0
        for u in op.operands:
            into |= reach[u]
            past_into |= past[u]
        if not fusible(op) or is_reduction(op.primitive):
            past_into |= into
        into |= bit.get(op.id, 0)
        for r in op.results:
            reach[r], past[r] = into, past_into
    for a, b in bit.items():
        op = ops[a]
        for r in op.results:
            for u in prog.users(r):
                if any(w != r and past[w] & b for w in ops[u].operands):
                    blocked[a] = True
    return blocked


def _constant(prog, v: int) -> bool:
    """Whether v is a constant or a broadcast of one."""
    value = prog.values[v]
    if value.producer == NO_OP:
        return value.origin in (CONST, LITERAL)
    op = prog.ops[value.producer]
    return op.primitive == "broadcast_in_dim" and _constant(prog, op.operands[0])


# YNNPACK reduces these dtypes (ynn_support.cc IsReduceLikeOpSupportedByYnn): sums in f32 and
# f64 (an f32 accumulator for 16-bit inputs, which a jaxpr's same-dtype sum does not ask for),
# maxima and minima in floats.
_YNN_REDUCE_DTYPES = {"reduce_sum": ("float32", "float64"),
                      "reduce_max": ("float32", "float64", "bfloat16", "float16"),
                      "reduce_min": ("float32", "float64", "bfloat16", "float16")}
_YNN_MIN_ELEMENTS = 4096  # IsInstructionPreferredByYnn: smaller ones XLA emits itself


def _ynn_capable(prog, op) -> bool:
    """Whether YNNPACK can run this reduction (its kind and dtype), whatever its size."""
    dtypes = _YNN_REDUCE_DTYPES.get(op.primitive)
    if dtypes is None or not op.operands or not op.params.get("axes"):
        return False
    return str(prog.values[op.operands[0]].dtype) in dtypes


def _ynn_reduction(prog, op) -> bool:
    """Whether XLA:CPU runs this reduction as a YNNPACK custom fusion."""
    if not _ynn_capable(prog, op):
        return False
    return max(int(np.prod(prog.values[v].shape, dtype=np.int64))
               for v in (*op.operands, *op.results)) >= _YNN_MIN_ELEMENTS


def library_inputs(prog, fused: np.ndarray) -> tuple[np.ndarray, dict, list, np.ndarray]:
    """(threshold [V], readers, broadcasts, taken_in [N]): for a fused value that a YNNPACK
    reduction reads from memory, the per-device bytes from which it does (inf elsewhere),
    {value: the reductions reading it}, the broadcasts those reductions read
    (LibraryBroadcast), and for each elementwise op a reduction's library fusion takes in,
    the elements of that reduction's operand (0 for the others).

    XLA:CPU's library rewriter grows a YNNPACK reduction upward through the elementwise ops
    all of whose readers it has already taken in (LibraryRewriter::FuseNeighbors); an operand
    read by anything else (a layer norm's x - mean and normalised x, read again by the
    normalisation and by the backward pass) is an input of the library fusion, which, unlike
    a loop fusion, cannot recompute it: XLA writes it to memory for the library fusions that
    read it (the loop fusions reading it still recompute it from its operands). The
    reduction is the library's only where an operand or its result has 4096 elements per
    device (IsInstructionPreferredByYnn), so the value is written from a per-device size on.
    An op it takes in is computed inside the library fusion and never written, though
    fusion_copies counts it a fusion of its own (softmax's gradient times its output, read by
    the sum alone).
    Values XLA's CSE merges (common_values) count once, read by the readers of all.

    A broadcast is never taken in: one the jaxpr leaves implicit (an elementwise op of
    [b, s, d] and [1, 1, d], a layer norm's scale or its [b, s, 1] rsqrt) is a broadcast in
    XLA's HLO, and a library fusion reading it reads it whole from memory, [b, s, d], not
    the [1, 1, d] the jaxpr names (a flax.nnx transformer's five layer norms under Megatron,
    batch replicated: ten [8, 16, 32] broadcasts, made in the forward pass and held until
    the backward reductions, jax 0.10.2). An explicit broadcast_in_dim is such an input too.
    """
    values, ops = prog.values, prog.ops
    threshold = np.full(len(values), np.inf)
    numel = lambda v: max(1, int(np.prod(values[v].shape, dtype=np.int64)))  # noqa: E731
    canon = common_values(prog)
    readers: dict[int, set] = {}
    broadcasts: dict[tuple, LibraryBroadcast] = {}
    taken_in = np.zeros(len(ops), np.int64)
    for op in ops:
        if op.body or not _ynn_capable(prog, op):
            continue

        def from_size(v):  # per-device bytes of v when the reduction's operand has 4096
            share = numel(v) / numel(op.operands[0])
            return np.ceil(_YNN_MIN_ELEMENTS * share) * values[v].dtype.itemsize

        absorbed = {op.id}
        stack = [op.id]
        while stack:
            reader = ops[stack.pop()]
            for u in reader.operands:
                if reader.id != op.id and _implicitly_broadcast(prog, reader, u):
                    r = reader.results[0]
                    key = (int(canon[u]), values[r].shape)
                    b = broadcasts.setdefault(key, LibraryBroadcast(int(canon[u]), int(r),
                                                                    from_size(r), set()))
                    b.readers.add(op.id)
                    continue
                p = values[u].producer
                if not values[u].ndim or p == NO_OP or not fused[u]:
                    continue  # a parameter, a constant, or a value in memory anyway
                producer = ops[p]
                if p in absorbed:
                    continue
                if (producer.primitive not in _NOT_TAKEN_IN
                        and not is_reduction(producer.primitive)
                        and all(r in absorbed for w in producer.results
                                for r in prog.users(w))):
                    absorbed.add(p)
                    stack.append(p)
                    taken_in[p] = max(taken_in[p], numel(op.operands[0]))
                    continue
                c = canon[u]  # XLA's CSE computes x - mean once for the two the jaxpr has
                threshold[c] = min(threshold[c], from_size(u))
                readers.setdefault(int(c), set()).add(op.id)
    return threshold, readers, list(broadcasts.values()), taken_in


# Ops a YNNPACK library fusion does not grow into: their results are its inputs.
_NOT_TAKEN_IN = frozenset({"transpose", "broadcast_in_dim"})


@dataclass(frozen=True)
class LibraryBroadcast:
    """A broadcast XLA makes of `operand` for the elementwise op whose result `like` it
    matches (shape, and so sharding), read from memory by the YNNPACK reductions `readers`
    (op ids), written once its per-device bytes reach `min_nbytes`."""

    operand: int
    like: int
    min_nbytes: float
    readers: set


def _implicitly_broadcast(prog, op, u: int) -> bool:
    """Whether elementwise `op` reads `u` broadcast along size-1 dims (jax's implicit rank-
    preserving broadcast, [1, 1, d] against [b, s, d]): XLA's HLO makes that a broadcast."""
    if len(op.results) != 1 or not fusible(op) or is_reduction(op.primitive) \
            or op.primitive in _RESHAPING:
        return False
    v, r = prog.values[u].shape, prog.values[op.results[0]].shape
    return 0 < len(v) == len(r) and v != r and all(a in (1, b) for a, b in zip(v, r))


# Ops whose operand and result differ in shape by what they do, not by broadcasting.
_RESHAPING = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose",
                        "rev", "concatenate", "pad", "slice", "dynamic_slice",
                        "dynamic_update_slice", "iota", "cumsum"})


def common_values(prog) -> np.ndarray:
    """[V]: the first value computing the same thing (itself where none does): the values
    XLA's CSE pass merges, elementwise ops of the same operands and parameters (jax's
    autodiff recomputes x - mean for the JVP of a layer norm's variance)."""
    canon = np.arange(len(prog.values))
    seen = {}
    for op in prog.ops:
        if op.body or len(op.results) != 1 or not fusible(op):
            continue
        try:
            key = (op.primitive, op.region, tuple(int(canon[u]) for u in op.operands),
                   tuple(sorted((k, repr(v)) for k, v in op.params.items())))
        except TypeError:
            continue
        r = op.results[0]
        if key in seen:
            canon[r] = seen[key]
        else:
            seen[key] = r
    return canon
