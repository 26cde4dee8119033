"""Where XLA writes values to memory: its fusion of elementwise chains and of attention.

Memory traffic and temporaries exist only at fusion boundaries. XLA fuses a chain of
elementwise and data-movement ops into one kernel, duplicating a cheap producer into each of
its consumers, and folds elementwise producers into the reductions that read them (input
fusion); matmuls, convolutions, gathers, scatters, sorts and loops stay kernels of their own.
So a value is *fused* (never written) when a fusible elementwise op makes it and only fusible
ops of the same region read it; a fusion *cluster* (ops joined by fused values) reads each of
its inputs once.

Attention written with `jax.nn.dot_product_attention` runs as one flash-attention kernel on
GPUs and TPUs (cuDNN, splash): its score-shaped intermediates (logits, mask, probabilities and
their gradients) are never written, its softmax runs inside the kernel, and only q, k, v, the
output, their gradients and the row statistics reach memory. On the CPU XLA runs the same ops
unfused, as plain-JAX attention runs everywhere.
"""

from __future__ import annotations

import numpy as np

from ..program import CONST, LITERAL, NO_OP
from ..rules import is_causal

# cuDNN's flash attention as JAX traces it on a GPU (implementation="cudnn"): one custom call
# each way, its scores never in memory (rules/_attention.py).
CUDNN_FORWARD = frozenset({"dot_product_attention_fwd_wrapper"})
CUDNN_BACKWARD = frozenset({"dot_product_attention_bwd_wrapper"})
CUDNN_ATTENTION = CUDNN_FORWARD | CUDNN_BACKWARD

# Ops XLA fuses into their neighbours (loop fusion): their results need not reach memory.
MOVEMENT = frozenset({
    "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "convert_element_type",
    "copy", "rev", "iota", "select_n", "clamp", "concatenate", "pad", "slice",
    "dynamic_slice", "dynamic_update_slice", "stop_gradient", "reduce_precision",
    "sharding_constraint", "integer_pow", "square", "pow",
})
NOT_FUSIBLE = frozenset({
    "dot_general", "conv_general_dilated", "gather", "scatter", "scatter-add", "scatter-mul",
    "scatter-min", "scatter-max", "scatter-sub", "sort", "top_k", "cumsum", "cumprod",
    "cummax", "cummin", "cumlogsumexp", "argmax", "argmin", "scan", "while", "cond",
    "custom_linear_solve", "rng_bit_generator", "threefry2x32", "optimization_barrier",
    "reduce_window", "reduce_window_sum", "reduce_window_max", "reduce_window_min",
    "select_and_scatter_add", "select_and_gather_add",
    # a shard_map body is a computation of its own (its ops fuse among themselves), and a
    # host callback a custom call: neither is cloned into its readers
    "shard_map", "pure_callback", "io_callback", "debug_callback",
}) | CUDNN_ATTENTION  # a custom call

# The einsums of jax.nn.dot_product_attention's XLA implementation (jax/_src/nn/functions.py,
# _dot_product_attention_core), which jnp.einsum records as the name scope of their ops: the
# logits q.k and the output probs.v (their transposes in the backward pass keep the scopes).
ATTENTION_EINSUMS = frozenset({"BTNH,BSNH->BNTS", "BNTS,BSNH->BTNH"})

# What an op is to the kernel that runs it.
KERNEL_OWN, KERNEL_ATTENTION, KERNEL_INSIDE = 0, 1, 2
# a shard_map: its body runs on each device's shard as the user wrote it, so its flops are
# per device already (_static._manual_body_flops), whatever the plan shards outside
KERNEL_MANUAL = 3


def _is_reduction(name: str) -> bool:
    return name.startswith("reduce_") and name not in ("reduce_precision",)


def _fusible(op) -> bool:
    return not op.body and op.primitive not in NOT_FUSIBLE


def fused_values(prog) -> np.ndarray:
    """[V] bool: values XLA does not write: made by a fusible op that is not a reduction (a
    reduction's result is its kernel's output) and read only by fusible ops of its region."""
    values, ops = prog.values, prog.ops
    fused = np.zeros(len(values), bool)
    outputs = set(prog.outputs)
    for v in values:
        if v.producer == NO_OP or v.id in outputs or v.ndim == 0:
            continue
        op = ops[v.producer]
        if not _fusible(op) or _is_reduction(op.primitive) or v.id not in op.results:
            continue
        users = prog.users(v.id)
        if users and all(_fusible(ops[u]) and ops[u].region == op.region for u in users):
            fused[v.id] = True
    return fused


def attention_kernels(prog):
    """(inside [V] bool, own [N] int8, kernel [N] int8, flop_scale [N]) of the fused kernels.

    own: what each op is to the kernel that runs it on every compiler: KERNEL_MANUAL for a
    shard_map, KERNEL_ATTENTION for cuDNN's attention (a custom call), KERNEL_OWN otherwise.
    kernel: the same where XLA's own attention fuses too (CostModel picks by its compiler
    profile's fuses_attention): KERNEL_ATTENTION for jax.nn.dot_product_attention's matmuls,
    KERNEL_INSIDE for the ops that make values inside it (run within the kernel); inside: its
    score-shaped values (never written by a flash kernel). flop_scale: 0.5 for the matmuls of
    causal attention (a flash kernel skips the masked half), 1 otherwise.
    """
    values, ops = prog.values, prog.ops
    V, N = len(values), len(ops)
    inside = np.zeros(V, bool)
    own = np.zeros(N, np.int8)
    flop_scale = np.ones(N)
    own[[op.id for op in ops if op.primitive == "shard_map"]] = KERNEL_MANUAL
    for op in ops:
        if op.primitive in CUDNN_ATTENTION:
            own[op.id] = KERNEL_ATTENTION
            flop_scale[op.id] = 0.5 if is_causal(op.params) else 1.0
    kernel = own.copy()
    dots = [op for op in ops if op.primitive == "dot_general"
            and op.name_scope.rsplit("/", 1)[-1] in ATTENTION_EINSUMS]
    if not dots:
        return inside, own, kernel, flop_scale
    numel = lambda v: int(np.prod(values[v].shape, dtype=np.int64))  # noqa: E731
    # The score tensor of each attention matmul is its largest operand or result.
    scores = {max((*op.operands, *op.results), key=numel) for op in dots}
    score_sizes = {numel(v) for v in scores}
    # Grow through the elementwise ops between them: every score-sized value they make.
    stack = list(scores)
    while stack:
        v = stack.pop()
        if inside[v]:
            continue
        inside[v] = True
        near = [ops[values[v].producer]] if values[v].producer != NO_OP else []
        near += [ops[u] for u in prog.users(v)]
        for op in near:
            if not _fusible(op):
                continue
            for w in (*op.operands, *op.results):
                if not inside[w] and values[w].ndim and numel(w) in score_sizes:
                    stack.append(w)
    causal = False
    for op in ops:
        if op.primitive != "dot_general" and op.results and all(inside[r] for r in op.results):
            kernel[op.id] = KERNEL_INSIDE
            causal |= any(_from_tril(prog, u) for u in op.operands if not inside[u])
    for op in dots:
        kernel[op.id] = KERNEL_ATTENTION
    if causal:
        flop_scale[[op.id for op in dots]] = 0.5
    return inside, own, kernel, flop_scale


def _from_tril(prog, v: int, depth: int = 3) -> bool:
    """Whether `v` is (a broadcast of) jnp.tril's causal mask."""
    producer = prog.values[v].producer
    if producer == NO_OP or depth == 0:
        return False
    op = prog.ops[producer]
    if op.name_scope.rsplit("/", 1)[-1] == "tril":
        return True
    return any(_from_tril(prog, u, depth - 1) for u in op.operands)


def memory_traffic(prog, fused: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(io_op, io_val): the (op, value) pairs that move a value between HBM and the op's
    kernel. An op writes its results that are not fused; a fusion cluster (ops joined by
    fused values) reads each of its unfused inputs once, at the first op of the cluster that
    reads it."""
    values, ops = prog.values, prog.ops
    cluster = np.arange(len(ops))

    def find(i):
        while cluster[i] != i:
            cluster[i] = cluster[cluster[i]]
            i = cluster[i]
        return i

    for v in np.nonzero(fused)[0]:
        a = find(values[v].producer)
        for u in prog.users(int(v)):
            b = find(u)
            if a != b:
                cluster[b] = a
    io_op, io_val, read = [], [], set()
    for op in ops:
        if op.body:
            continue
        c = find(op.id)
        moved = set()
        for v in op.operands:
            if values[v].ndim and not fused[v] and (c, v) not in read:
                read.add((c, v))
                moved.add(v)
        moved.update(v for v in op.results if values[v].ndim and not fused[v])
        for v in sorted(moved):
            io_op.append(op.id)
            io_val.append(v)
    return np.array(io_op, np.int32), np.array(io_val, np.int32)


def fused_live_ends(prog, live_end: np.ndarray, fused: np.ndarray) -> np.ndarray:
    """live_end with a fused value's inputs kept until its last reader: XLA recomputes the
    fused producer inside each consumer, which reads those inputs then."""
    end = live_end.copy()
    for op in reversed(prog.ops):
        last = max((end[r] for r in op.results if fused[r]), default=None)
        if last is not None:
            for u in op.operands:
                end[u] = max(end[u], last)
    return end


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
# cheap tail is cloned into every fusion that reads the op (its flops: _static.py's
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
    return np.array([_fusible(op) and not _is_reduction(op.primitive) and bool(op.results)
                     and any(prog.users(r) for r in op.results) and fusions[op.id] == (op.id,)
                     for op in prog.ops])


def _consumer_fusions(prog, tails: dict | None = None) -> list:
    """Per op, the fusions its copies land in (the ids of their roots): fusion_copies. tails,
    where given, gets {op id: fusions its cloned tail lands in} of the CLONED_TAIL ops that
    are fusions of their own."""
    values, ops = prog.values, prog.ops
    outputs = set(prog.outputs)
    numel = lambda v: int(np.prod(values[v].shape, dtype=np.int64))  # noqa: E731
    fusions: list = [None] * len(ops)  # the fusions an op's clones land in (ids of their roots)

    def may_duplicate(op) -> bool:
        rank = max((values[r].ndim for r in op.results), default=0)
        wide = sum(1 for u in op.operands if values[u].ndim and values[u].ndim >= rank
                   and not (values[u].producer != NO_OP
                            and ops[values[u].producer].primitive in _SPREAD))
        return wide <= 1 or (sum(numel(u) for u in set(op.operands))
                             <= sum(numel(r) for r in op.results))

    for op in reversed(ops):
        if not _fusible(op) or _is_reduction(op.primitive):
            fusions[op.id] = (op.id,)
            continue
        into, own = set(), False
        for r in op.results:
            own |= r in outputs
            for u in prog.users(r):
                if (ops[u].region != op.region or not _fusible(ops[u])
                        or _ynn_reduction(prog, ops[u])):
                    own = True
                else:
                    into.update(fusions[u])
        expensive = op.primitive in EXPENSIVE and not (
            op.primitive == "div" and _constant(prog, op.operands[-1]))
        if (expensive and len(into) + own > 1) or (own and not may_duplicate(op)):
            if tails is not None and expensive and op.primitive in CLONED_TAIL:
                tails[op.id] = len(into) + own
            into = set()
        if own or not into:
            into.add(op.id)
        fusions[op.id] = tuple(sorted(into))
    return fusions


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


def library_inputs(prog, fused: np.ndarray) -> tuple[np.ndarray, dict]:
    """(threshold [V], readers): for a fused value that a YNNPACK reduction reads from memory,
    the per-device bytes from which it does (inf elsewhere), and {value: the reductions
    reading it}.

    XLA:CPU's library rewriter grows a YNNPACK reduction upward through the elementwise ops
    all of whose readers it has already taken in (LibraryRewriter::FuseNeighbors); an operand
    read by anything else (a layer norm's x - mean and normalised x, read again by the
    normalisation and by the backward pass) is an input of the library fusion, which, unlike
    a loop fusion, cannot recompute it: XLA writes it to memory for the library fusions that
    read it (the loop fusions reading it still recompute it from its operands). The
    reduction is the library's only where an operand or its result has 4096 elements per
    device (IsInstructionPreferredByYnn), so the value is written from a per-device size on.
    Values XLA's CSE merges (common_values) count once, read by the readers of all."""
    values, ops = prog.values, prog.ops
    threshold = np.full(len(values), np.inf)
    numel = lambda v: max(1, int(np.prod(values[v].shape, dtype=np.int64)))  # noqa: E731
    canon = common_values(prog)
    readers: dict[int, set] = {}
    for op in ops:
        if op.body or not _ynn_capable(prog, op):
            continue
        absorbed = {op.id}
        stack = [op.id]
        while stack:
            for u in ops[stack.pop()].operands:
                p = values[u].producer
                if not values[u].ndim or p == NO_OP or not fused[u]:
                    continue  # a parameter, a constant, or a value in memory anyway
                producer = ops[p]
                if p in absorbed:
                    continue
                if (producer.primitive != "transpose" and not _is_reduction(producer.primitive)
                        and all(r in absorbed for w in producer.results
                                for r in prog.users(w))):
                    absorbed.add(p)
                    stack.append(p)
                    continue
                # per-device elements of this value when the reduction's operand has 4096
                bytes_per_element = values[u].dtype.itemsize
                share = numel(u) / numel(op.operands[0])
                c = canon[u]  # XLA's CSE computes x - mean once for the two the jaxpr has
                threshold[c] = min(threshold[c],
                                   np.ceil(_YNN_MIN_ELEMENTS * share) * bytes_per_element)
                readers.setdefault(int(c), set()).add(op.id)
    return threshold, readers


def common_values(prog) -> np.ndarray:
    """[V]: the first value computing the same thing (itself where none does): the values
    XLA's CSE pass merges, elementwise ops of the same operands and parameters (jax's
    autodiff recomputes x - mean for the JVP of a layer norm's variance)."""
    canon = np.arange(len(prog.values))
    seen = {}
    for op in prog.ops:
        if op.body or len(op.results) != 1 or not _fusible(op):
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


# Ops XLA compiles to a bitcast or to nothing (a change of shape, a sharding annotation).
NO_KERNEL = frozenset({"reshape", "squeeze", "expand_dims", "sharding_constraint",
                       "stop_gradient", "optimization_barrier"})


def launches(prog, fused: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """[N] the kernels each op launches: one where it writes a result to memory (the root of a
    fusion, a matmul, a library call), none where its results stay inside a fusion or a fused
    attention kernel, for a bitcast, or for a region op (its body's ops launch their own)."""
    out = np.zeros(len(prog.ops))
    for op in prog.ops:
        if op.body or op.primitive in NO_KERNEL or kernel[op.id] == KERNEL_INSIDE:
            continue
        if any(not fused[r] for r in op.results):
            out[op.id] = 1.0
    return out
