"""Flops per op as XLA's HloCostAnalysis counts them, so that the estimate and
`cost_analysis()` agree: matmuls and convolutions by their multiply-adds, elementwise ops one
per element, transcendentals none, and the ops XLA expands into several (CHLO decompositions,
threefry, a max-pool's gradient, cumulative reductions) by the arithmetic of their expansion.

Built from the program's shapes and its constant folding (_folding.py), once per analysis:
`flop_counts` gives each op's whole-tensor flops, the flops of each further copy where XLA:CPU's
fusion clones it into several consumers, and how many copies it emits (_cpu_fusion.py). The
device's compiler profile decides whether the copies count (_device_tables.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..rules import qkv_axes
from ._cpu_fusion import fusion_copies
from ._folding import Folding, simplified_away
from ._fusion import CUDNN_ATTENTION, CUDNN_BACKWARD, MOVEMENT


# Ops XLA runs as one transcendental each, which HloCostAnalysis counts apart from flops (those
# it expands into several ops are in _EXPANDED_FLOPS).
_TRANSCENDENTAL = frozenset({
    "exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "cbrt", "tanh", "sin", "cos", "tan",
    "atan2", "erf", "pow", "atan",
})
# Ops lowered to several HLO ops (CHLO decompositions: polynomials and rational
# approximations around an exp or log; XLA's LogisticExpander: 1 / (1 + exp(-x))), whose
# arithmetic HloCostAnalysis counts as flops beside their transcendentals: flops per float32
# element as cost_analysis() counts them on XLA:CPU (jax 0.10.2; tests/test_cost.py). exact
# GELU is an erfc.
_EXPANDED_FLOPS = {
    "erfc": 60.0, "erf_inv": 37.0, "lgamma": 52.0, "digamma": 73.0, "asin": 5.0, "acos": 3.0,
    "sinh": 10.0, "cosh": 3.0, "asinh": 11.0, "acosh": 7.0, "atanh": 6.0, "logistic": 3.0,
    "exp2": 1.0,
    # JAX >= 0.11's tanh derivative: 1 - x * x, a multiply and a subtract
    "one_minus_square": 2.0,
}
# Of those, the flops of each further copy where XLA:CPU's fusion clones the op into several
# consumer fusions: the expansion's cheap tail after its last expensive op (a log, a sqrt, an
# exp, a division), which is cloned like any cheap elementwise op while the expensive part runs
# once (an erf_inv read by Adam's two moment updates: 73 flops per element, not 37). Measured
# as cost_analysis() on XLA:CPU of the op read by two fusions less that of one (jax 0.10.2;
# tests/test_cost.py). The ops whose expansion ends in an expensive op (acos, logistic) are
# not cloned: _cpu_fusion.py's CLONED_TAIL lists these.
_CLONED_FLOPS = {
    "erf_inv": 36.0, "erfc": 62.0, "lgamma": 33.0, "digamma": 20.0, "asin": 1.0, "sinh": 6.0,
    "cosh": 1.0, "asinh": 8.0, "acosh": 3.0, "atanh": 5.0,
}
# random_bits lowers to jax's partitionable threefry2x32: per element, counters from iotas, the
# key schedule and 20 rounds of add / rotate / xor, the rounds in a loop whose body
# HloCostAnalysis counts once: 47 flops per element of 32-bit bits, one more to narrow to 8
# or 16 bits, three more to join two words into 64 (cost_analysis() on XLA:CPU, jax 0.10.2;
# tests/test_cost.py). The bits of a shard are made on its device, so it shards like them.
_THREEFRY_FLOPS = {8: 48.0, 16: 48.0, 32: 47.0, 64: 50.0}
# Elementwise ops HloCostAnalysis counts at one flop per element, though XLA fuses them.
_ONE_FLOP = frozenset({"select_n", "square", "convert_element_type", "clamp"})
# Reductions HloCostAnalysis counts as (operand - result) elements: each combine merges two
# into one (a sum over an ensemble of 2 counts half the operand, not all of it). psum, pmax
# and pmin are these over vmap's positional axes (rules/_reduce.py).
_REDUCERS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
                       "psum", "pmax", "pmin"})

# Of a complex operand, the flops per element cost_analysis() counts where XLA expands the op
# into real arithmetic on its parts (XLA:CPU, jax 0.10.2, complex64; tests/test_cost.py): a
# complex exp is exp, cos and sin of the parts and 15 flops, a conj a negation and a rebuild.
# Complex add, mul, div, abs and dots count as their real counterparts do.
_COMPLEX_FLOPS = {
    "exp": 15.0, "log": 61.0, "log1p": 79.0, "sqrt": 98.0, "square": 14.0, "conj": 4.0,
    "sin": 14.0, "cos": 15.0, "sinh": 33.0, "cosh": 33.0, "logistic": 18.0, "exp2": 16.0,
}


@dataclass(frozen=True, eq=False)
class FlopCounts:
    """Flops of each op of the program, whole-tensor (not divided by any sharding)."""

    whole: np.ndarray           # [N] float64: one copy of the op (0 where XLA folds it away)
    clone: np.ndarray           # [N] float64: each copy after the first (_CLONED_FLOPS)
    fusion_copies: np.ndarray   # [N] float64: the copies XLA:CPU's fusion emits of the op


def flop_counts(prog, folding: Folding) -> FlopCounts:
    """The FlopCounts of program `prog` with its constant folding."""
    values = prog.values
    whole = np.zeros(len(prog.ops), np.float64)
    clone = np.zeros(len(prog.ops), np.float64)
    for op in prog.ops:
        simplified = simplified_away(op, folding.folded, folding.uniform)
        whole[op.id] = 0.0 if simplified else op_flops(op, values)
        clone[op.id] = whole[op.id]
        if op.primitive in _CLONED_FLOPS and whole[op.id]:
            clone[op.id] *= _CLONED_FLOPS[op.primitive] / _EXPANDED_FLOPS[op.primitive]
    return FlopCounts(whole, clone, fusion_copies(prog))


def random_bits_width(op) -> int:
    """The width of the words a random_bits op makes (jax's default: 32)."""
    return int(op.params.get("bit_width", 32))


def op_flops(op, values) -> float:
    """Flops as XLA's HloCostAnalysis counts them (so the estimate and cost_analysis() agree):
    2 per multiply-add of a matmul or convolution, one per element of an elementwise op,
    integer powers by their multiplies, transcendentals none, ops XLA expands into several
    (_EXPANDED_FLOPS, random_bits) by the arithmetic of their expansion."""
    name = op.primitive
    out = [values[r].shape for r in op.results]
    size = lambda s: float(np.prod(s, dtype=np.float64)) if s else 1.0  # noqa: E731
    if op.body or not out:
        return 0.0
    if name == "shard_map":
        return _manual_body_flops(op.params["jaxpr"])
    if name in CUDNN_ATTENTION:
        return _cudnn_attention_flops(op, values)
    if name in _COMPLEX_FLOPS and op.operands and np.issubdtype(
            values[op.operands[0]].dtype, np.complexfloating):
        return size(out[0]) * _COMPLEX_FLOPS[name]
    if name in _TRANSCENDENTAL:
        return 0.0
    if name in _EXPANDED_FLOPS:
        return size(out[0]) * _EXPANDED_FLOPS[name]
    if name in _ONE_FLOP:
        return size(out[0])
    if name == "random_bits":
        return size(out[0]) * _THREEFRY_FLOPS.get(random_bits_width(op), 47.0)
    if name == "integer_pow":  # square-and-multiply
        y = abs(int(op.params.get("y", 2)))
        return size(out[0]) * max(1, y.bit_length() - 1 + bin(y).count("1") - 1)
    if name == "dot_general":
        (lc, _), _ = op.params["dimension_numbers"]
        k = size(tuple(values[op.operands[0]].shape[d] for d in lc))
        return 2.0 * size(out[0]) * k
    if name == "conv_general_dilated":
        return _conv_flops(op, values)
    if name in MOVEMENT or name in ("gather", "dynamic_slice", "slice", "concatenate", "pad",
                                     "broadcast_in_dim", "iota", "rng_bit_generator",
                                     "optimization_barrier"):  # (it forwards its operands)
        return 0.0
    if name in _CUMULATIVE:
        shape = values[op.operands[0]].shape
        n = shape[op.params["axis"]] if shape else 1
        rows = size(shape) / max(n, 1)
        return rows * _scan_flops(n) * (8.0 if name == "cumlogsumexp" else 1.0)
    if name in _REDUCERS:  # one combine per element that does not become a result
        return sum(size(values[v].shape) for v in op.operands) - sum(size(y) for y in out)
    if name.startswith("reduce_") or name in ("argmax", "argmin") or name.startswith("cum"):
        return size(values[op.operands[0]].shape)
    if name == "select_and_scatter_add":
        # XLA expands it into a reduce-window whose comparator carries the window index (about
        # 8 flops per window element) and a scatter-add: 34 flops per source element for a
        # 2 x 2 window, as XLA:CPU's cost_analysis() counts the expansion.
        window = size(op.params["window_dimensions"])
        return size(values[op.operands[0]].shape) * (8.0 * window + 2.0)
    if name.startswith("scatter"):
        return size(values[op.operands[2]].shape) if len(op.operands) > 2 else 0.0
    if name == "sort":
        n = size(out[0])
        return n * max(1.0, np.log2(max(2.0, values[op.operands[0]].shape[
            op.params.get("dimension", 0)])))
    return size(out[0]) * len(out)  # elementwise: one flop per element and result


def _cudnn_attention_flops(op, values) -> float:
    """cuDNN's fused attention by FlashAttention's count (Dao et al. 2022): the forward's two
    matmuls, q k^T and p v, 4 B N T S H; the backward's five, 2.5 times that. Whole: a causal
    kernel's skipped half is its flop_scale (_fusion.attention_kernels)."""
    q, k = (values[v].shape for v in op.operands[:2])
    t_ax, _, h_ax = qkv_axes(q, op.params)
    rows = float(np.prod(q, dtype=np.float64)) / q[h_ax]  # B N T
    forward = 4.0 * rows * k[t_ax] * q[h_ax]
    return forward * (2.5 if op.primitive in CUDNN_BACKWARD else 1.0)


@dataclass(frozen=True)
class _BodyOp:
    """An equation of a jaxpr toast-lab does not trace, in the shape op_flops reads."""

    primitive: str
    params: dict
    operands: tuple
    results: tuple
    body: tuple = ()


# Inside a shard_map body: ops that only mark a value as varying over mesh axes (pvary lowers
# to nothing) or move it (XLA counts no flops for a collective that does not combine), and
# the all-reduces over named axes, which cost_analysis() counts one flop per element of
# (jax 0.10.2: psum of an f32[4, 8] shard, 32; tests/test_cost.py).
_MANUAL_MOVES = frozenset({"pvary", "pbroadcast", "ppermute", "all_gather", "all_gather_invariant",
                           "all_to_all", "axis_index"})


_MANUAL_REDUCES = frozenset({"psum", "psum_invariant", "pmax", "pmin", "reduce_scatter",
                             "psum_scatter"})


def _manual_body_flops(jaxpr) -> float:
    """Flops of one device's run of a `shard_map` body: its equations counted on the shapes
    they have there, the per-device shard. XLA partitions nothing inside (the body is manual),
    so every device runs all of it and cost_analysis() counts it once, whatever the plan does
    outside (jax 0.10.2: a [16, 16] @ [16, 16] under in_specs P("data"), P(None, "model") on
    data=4 x model=2 counts the [4, 16] @ [16, 8] of a shard; tests/test_cost.py). A loop or
    call inside counts its body as op_flops' callers do: a scan's per iteration, a while
    loop's once, a cond's costliest branch."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0.0
    for eqn in jaxpr.eqns:
        inner = [getattr(v, "jaxpr", v) for p in eqn.params.values()
                 for v in (p if isinstance(p, (tuple, list)) else (p,))
                 if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")]
        if inner:
            parts = [_manual_body_flops(j) for j in inner]
            if eqn.primitive.name == "cond":
                total += max(parts)
            elif eqn.primitive.name == "while":
                total += sum(parts)
            else:
                total += sum(parts) * float(eqn.params.get("length", 1))
            continue
        name = eqn.primitive.name
        if name in _MANUAL_MOVES:
            continue
        if name in _MANUAL_REDUCES:  # an all-reduce: one combine per element of its result
            total += float(sum(np.prod(v.aval.shape, dtype=np.float64) for v in eqn.outvars))
            continue
        avals = [v.aval for v in list(eqn.invars) + list(eqn.outvars)]
        n = len(eqn.invars)
        op = _BodyOp(eqn.primitive.name, eqn.params, tuple(range(n)),
                     tuple(range(n, len(avals))))
        total += op_flops(op, avals)
    return total


# JAX lowers a cumulative reduction on CPU and TPU to a reduce-window over the whole axis
# (loops.py, cumred_reduce_window_impl: window n, padding n - 1), which XLA's
# ReduceWindowRewriter (base length 16 on XLA:CPU) turns into a scan of 16-wide blocks and a
# scan of the blocks' totals. cost_analysis() counts that (_scan_flops); cumlogsumexp's
# combine (a logaddexp) counts 8 flops where the others count one.
_CUMULATIVE = frozenset({"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"})


def _scan_flops(n: int) -> float:
    """Flops XLA:CPU's cost_analysis() counts for one row of a cumulative reduction of length
    n (jax 0.10.2; measured n = 4 .. 4096, tests/test_cost.py): n (n - 1) up to 16; above, the
    row padded to 16 m elements costs 16 per element, plus m^2 - 1 for the block totals'
    scan up to m = 16 and that scan's own cost above."""
    if n <= 16:
        return float(n * (n - 1))
    m = -(-n // 16)
    return 16.0 * 16 * m + (m * m - 1.0 if m <= 16 else _scan_flops(m))


def _conv_flops(op, values) -> float:
    """Multiply-adds of a convolution that touch the input, x2, as XLA's HloCostAnalysis
    counts them: per spatial dim, the (output position, kernel tap) pairs that land inside the
    (dilated) input, not in its padding."""
    p = op.params
    lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
    lhs, rhs = values[op.operands[0]].shape, values[op.operands[1]].shape
    out = values[op.results[0]].shape
    taps = 1.0
    for j, (ld, rd, od) in enumerate(zip(lhs_spec[2:], rhs_spec[2:], out_spec[2:])):
        stride, (lo, _) = p["window_strides"][j], p["padding"][j]
        lhs_dil, rhs_dil = p["lhs_dilation"][j], p["rhs_dilation"][j]
        dilated = (lhs[ld] - 1) * lhs_dil + 1
        o = np.arange(out[od])[:, None] * stride - lo + np.arange(rhs[rd])[None, :] * rhs_dil
        taps *= float(np.count_nonzero((o >= 0) & (o < dilated) & (o % lhs_dil == 0)))
    per_group = lhs[lhs_spec[1]] / p.get("feature_group_count", 1)
    return 2.0 * out[out_spec[0]] * out[out_spec[1]] * per_group * taps
