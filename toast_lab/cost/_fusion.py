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

XLA:CPU's own decisions on top of this (cloning cheap producers, YNNPACK library fusions) are
_cpu_fusion.py.
"""

from __future__ import annotations

import numpy as np

from ..program import BODY_INPUT, NO_OP
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
# per device already (_flops._manual_body_flops), whatever the plan shards outside
KERNEL_MANUAL = 3


def is_reduction(name: str) -> bool:
    """Whether the primitive is a reduction (its result is its kernel's output)."""
    return name.startswith("reduce_") and name not in ("reduce_precision",)


def fusible(op) -> bool:
    """Whether XLA may fuse the op into its neighbours (not a region, not a NOT_FUSIBLE op)."""
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
        if not fusible(op) or is_reduction(op.primitive) or v.id not in op.results:
            continue
        users = prog.users(v.id)
        if users and all(fusible(ops[u]) and ops[u].region == op.region for u in users):
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
            if not fusible(op):
                continue
            for w in (*op.operands, *op.results):
                if not inside[w] and values[w].ndim and numel(w) in score_sizes:
                    stack.append(w)
    causal = False
    for op in ops:
        if op.primitive != "dot_general" and op.results and all(inside[r] for r in op.results):
            kernel[op.id] = KERNEL_INSIDE
            # (a score-shaped mask a loop reads as its operand is inside, but made outside)
            causal |= any(_from_tril(prog, u) for u in op.operands
                          if not inside[u] or values[u].origin == BODY_INPUT)
    for op in dots:
        kernel[op.id] = KERNEL_ATTENTION
    if causal:
        flop_scale[[op.id for op in dots]] = 0.5
    return inside, own, kernel, flop_scale


# Ops whose result is their first operand's mask in another shape or type.
_SAME_MASK = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims",
                        "convert_element_type"})


def _from_tril(prog, v: int, depth: int = 3) -> bool:
    """Whether `v` is (a broadcast of, or made within `depth` ops from) jnp.tril's causal
    mask, also where it reaches a loop body as an operand of the loop: JAX's partial
    evaluation of a scan moves the mask, which no iteration changes, out of the loop."""
    while True:
        while (outer := prog.outer_operand(v)) != v:
            v = outer
        producer = prog.values[v].producer
        if producer == NO_OP:
            return False
        op = prog.ops[producer]
        if op.name_scope.rsplit("/", 1)[-1] == "tril":
            return True
        if op.primitive not in _SAME_MASK:
            break
        v = op.operands[0]
    if depth == 0 or op.body:  # (not through what a loop computes)
        return False
    return any(_from_tril(prog, u, depth - 1) for u in op.operands)


# Ops whose results are their operands' buffers: XLA's dataflow analysis forwards the values
# through an opt-barrier (HloDataflowAnalysis), which copies nothing; it only orders them.
FORWARDS_OPERANDS = frozenset({"optimization_barrier"})


def memory_traffic(prog, fused: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(io_op, io_val): the (op, value) pairs that move a value between HBM and the op's
    kernel. An op writes its results that are not fused; a fusion cluster (ops joined by
    fused values) reads each of its unfused inputs once, at the first op of the cluster that
    reads it; an op that forwards its operands (FORWARDS_OPERANDS) moves nothing."""
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
        if op.body or op.primitive in FORWARDS_OPERANDS:
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
