"""Golden tests of the rule table: one small JAX snippet per primitive.

Each case traces a snippet, takes the first eqn of its primitive (searching nested jaxprs), builds
the rule from the eqn's shapes and params and compares `rule.to_text()` with its line in
tests/data/rules_golden.txt. Regenerate that file with

    TOAST_UPDATE_GOLDEN=1 pytest tests/test_rules.py

and read the diff: every line is a statement about sharding semantics.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import jax
import jax.ad_checkpoint
import jax.extend
import jax.lax.linalg as linalg
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental.layout import Layout, with_layout_constraint
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from toast_lab.program import REGION_PRIMITIVES

from . import newer_jax
from toast_lab.rules import RULES, FactorKind, OpRule, conservative_rule, rule_for

GOLDEN = Path(__file__).parent / "data" / "rules_golden.txt"
UPDATE = os.environ.get("TOAST_UPDATE_GOLDEN") == "1"


def f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def i32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.int32)


def u32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.uint32)


def c64(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.complex64)


def bf16(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.bfloat16)


def pred(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.bool_)


@dataclass(frozen=True)
class Case:
    id: str
    primitive: str
    fn: Callable
    args: tuple
    context: Callable = field(default=contextlib.nullcontext)  # around the trace
    where: Callable = field(default=lambda params: True)  # picks the eqn, by its params

    def __repr__(self):
        return self.id


def case(id, primitive, fn, *args, context=contextlib.nullcontext, where=lambda params: True):
    return Case(id, primitive, fn, args, context, where)


def _mesh(explicit=False):
    types = (AxisType.Explicit,) * 2 if explicit else (AxisType.Auto,) * 2
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=types)


def _explicit_mesh():
    return jax.set_mesh(_mesh(explicit=True))


# --- elementwise ---------------------------------------------------------------------------------

_UNARY_FLOAT = [
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "bessel_i0e", "bessel_i1e", "cbrt",
    "ceil", "cos", "cosh", "digamma", "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "floor",
    "is_finite", "lgamma", "log", "log1p", "logistic", "neg", "round", "rsqrt", "sign", "sin",
    "sinh", "sqrt", "square", "tan", "tanh",
]
_BINARY_FLOAT = ["add", "sub", "mul", "div", "max", "min", "pow", "atan2", "rem", "nextafter",
                 "igamma", "igammac", "igamma_grad_a", "polygamma", "zeta", "complex"]
_COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]
_BINARY_INT = {"and": lax.bitwise_and, "or": lax.bitwise_or, "xor": lax.bitwise_xor,
               "shift_left": lax.shift_left, "shift_right_logical": lax.shift_right_logical,
               "shift_right_arithmetic": lax.shift_right_arithmetic}

ELEMENTWISE = (
    [case(n, n, getattr(lax, n), f32(8, 16)) for n in _UNARY_FLOAT]
    + [case(n, n, getattr(lax, n), f32(8, 16), f32(8, 16)) for n in _BINARY_FLOAT + _COMPARE]
    + [case(n, n, fn, i32(8, 16), i32(8, 16)) for n, fn in _BINARY_INT.items()]
    + [
        case("clz", "clz", lax.clz, i32(8, 16)),
        case("population_count", "population_count", lax.population_count, i32(8, 16)),
        case("not", "not", lax.bitwise_not, i32(8, 16)),
        case("conj", "conj", lax.conj, c64(8, 16)),
        case("real", "real", lax.real, c64(8, 16)),
        case("imag", "imag", lax.imag, c64(8, 16)),
        case("integer_pow", "integer_pow", lambda x: x ** 3, f32(8, 16)),
        case("convert_element_type", "convert_element_type", lambda x: x.astype(jnp.int32),
             f32(8, 16)),
        case("reduce_precision", "reduce_precision", lambda x: lax.reduce_precision(x, 5, 10),
             f32(8, 16)),
        case("mulhi", "mulhi", lax.mulhi, u32(8, 16), u32(8, 16)),
        case("regularized_incomplete_beta", "regularized_incomplete_beta", lax.betainc,
             f32(8, 16), f32(8, 16), f32(8, 16)),
        case("add_scalar", "add", lambda x: x + 2.0, f32(8, 16)),
        # jax 0.10: n-ary ops broadcast size-1 dims; those must stay unmapped
        case("add_size1_broadcast", "add", lax.add, f32(8, 1), f32(1, 16)),
        case("add_any", "add_any", jax.grad(lambda x: jnp.sum(jnp.sin(x) * jnp.cos(x))),
             f32(8, 16)),
        case("select_n", "select_n", lax.select_n, pred(8, 16), f32(8, 16), f32(8, 16)),
        case("select_n_scalar_pred", "select_n", lax.select_n, pred(), f32(8, 16), f32(8, 16)),
        case("clamp_scalar_bounds", "clamp", lambda x: lax.clamp(0.0, x, 1.0), f32(8, 16)),
        case("clamp", "clamp", lax.clamp, f32(8, 16), f32(8, 16), f32(8, 16)),
        case("lt_to", "lt_to", lambda a, q: jnp.searchsorted(a, q, method="compare_all"),
             f32(8), f32(3)),
        case("le_to", "le_to",
             lambda a, q: jnp.searchsorted(a, q, side="right", method="compare_all"),
             f32(8), f32(3)),
        case("eq_to", "eq_to", lambda a, q: jnp.searchsorted(a, q, method="compare_all"),
             c64(8), c64(3)),
        case("bitcast_convert_type", "bitcast_convert_type",
             lambda x: lax.bitcast_convert_type(x, jnp.int32), f32(8, 16)),
        case("bitcast_convert_type_narrower", "bitcast_convert_type",
             lambda x: lax.bitcast_convert_type(x, jnp.uint16), f32(8, 16)),
        case("bitcast_convert_type_wider", "bitcast_convert_type",
             lambda x: lax.bitcast_convert_type(x, jnp.float32),
             jax.ShapeDtypeStruct((8, 2), jnp.uint16)),
    ]
)

# --- shape ---------------------------------------------------------------------------------------

SHAPE = [
    case("reshape_split", "reshape", lambda x: x.reshape(8, 4, 16), f32(8, 64)),
    case("reshape_merge", "reshape", lambda x: x.reshape(8, 64), f32(8, 4, 16)),
    case("reshape_regroup", "reshape", lambda x: x.reshape(4, 3), f32(2, 6)),
    case("reshape_no_common_factor", "reshape", lambda x: x.reshape(4, 6), f32(6, 4)),
    case("reshape_unit_dims", "reshape", lambda x: x.reshape(8, 1, 4, 4), f32(1, 8, 16)),
    case("reshape_flatten", "reshape", lambda x: x.reshape(-1), f32(2, 3, 4)),
    case("broadcast_in_dim_new_dim", "broadcast_in_dim",
         lambda x: lax.broadcast_in_dim(x, (4, 8, 16), (1, 2)), f32(8, 16)),
    case("broadcast_in_dim_size1", "broadcast_in_dim",
         lambda x: jnp.broadcast_to(x, (8, 16)), f32(1, 16)),
    case("broadcast_in_dim_expand_dims", "broadcast_in_dim",
         lambda x: jnp.expand_dims(x, 1), f32(8, 16)),
    case("squeeze", "squeeze", lambda x: jnp.squeeze(x, (0, 2)), f32(1, 8, 1, 16)),
    case("transpose", "transpose", lambda x: jnp.transpose(x, (2, 0, 1)), f32(4, 8, 16)),
    case("rev", "rev", lambda x: jnp.flip(x, 1), f32(8, 16)),
    case("iota", "iota", lambda: lax.broadcasted_iota(jnp.int32, (8, 16), 1)),
    case("concatenate", "concatenate", lambda x, y: jnp.concatenate([x, y], axis=1),
         f32(8, 16), f32(8, 4)),
    case("pad", "pad", lambda x: jnp.pad(x, ((1, 2), (0, 0))), f32(8, 16)),
    case("pad_interior", "pad", lambda x: lax.pad(x, 0.0, ((0, 0, 0), (0, 0, 1))), f32(8, 16)),
    case("split", "split", lambda x: jnp.split(x, [4, 12], axis=1), f32(8, 16)),
    case("tile", "tile", lambda x: jnp.tile(x, (2, 1)), f32(8, 16)),
    case("stack", "stack", lambda x, y: jnp.stack([x, y], axis=1), f32(8, 16), f32(8, 16)),
    case("unstack", "unstack", lambda x: list(jnp.unstack(x, axis=1)), f32(8, 4, 16)),
]

# --- indexing ------------------------------------------------------------------------------------

INDEXING = [
    case("slice", "slice", lambda x: x[2:6, ::2], f32(8, 16)),
    case("slice_full_dim", "slice", lambda x: x[:, 4:], f32(8, 16)),
    case("dynamic_slice", "dynamic_slice", lambda x, i: lax.dynamic_slice(x, (i, 0), (4, 16)),
         f32(8, 16), i32()),
    case("dynamic_update_slice", "dynamic_update_slice",
         lambda x, u, i: lax.dynamic_update_slice(x, u, (0, i)), f32(8, 16), f32(8, 4), i32()),
    case("gather_rows", "gather", lambda x, i: x[i], f32(8, 16), i32(3)),
    case("gather_embedding", "gather", lambda table, ids: table[ids], f32(100, 64), i32(4, 16)),
    case("gather_take_along_axis", "gather",
         lambda x, i: jnp.take_along_axis(x, i, axis=1), f32(8, 16), i32(8, 5)),
    case("gather_point", "gather", lambda x, i, j: x[i, j], f32(8, 16), i32(5), i32(5)),
    # a vmapped dynamic_index_in_dim (a pipeline stage picking its run of layers): every
    # dim indexed, the whole ones (start clamped to 0) passing through
    case("gather_vmapped_dynamic_index", "gather",
         jax.vmap(lambda x, i: jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False)),
         f32(2, 3, 8, 16), i32(2)),
    case("scatter-add", "scatter-add", lambda x, i, u: x.at[i].add(u),
         f32(8, 16), i32(3), f32(3, 16)),
    case("scatter-add_embedding_grad", "scatter-add",
         jax.grad(lambda table, ids: jnp.sum(table[ids] ** 2)), f32(100, 64), i32(4, 16)),
    case("scatter-sub", "scatter-sub", lambda x, i, u: x.at[i].subtract(u),
         f32(8, 16), i32(3), f32(3, 16)),
    case("scatter-mul", "scatter-mul", lambda x, i, u: x.at[i].multiply(u),
         f32(8, 16), i32(3), f32(3, 16)),
    case("scatter-min", "scatter-min", lambda x, i, u: x.at[i].min(u),
         f32(8, 16), i32(3), f32(3, 16)),
    case("scatter-max", "scatter-max", lambda x, i, u: x.at[i].max(u),
         f32(8, 16), i32(3), f32(3, 16)),
    case("scatter-add_batching_dims", "scatter-add",
         jax.grad(lambda x, i: jnp.sum(jnp.take_along_axis(x, i, axis=1))), f32(8, 16), i32(8, 5)),
    case("scatter-add_bincount", "scatter-add", lambda x: jnp.bincount(x, length=16), i32(64)),
    case("scatter-add_bincount_weights", "scatter-add",
         lambda x, w: jnp.bincount(x, w, length=16), i32(64), f32(64)),
    case("scatter-add_counts_2d", "scatter-add",
         lambda t: jnp.zeros(16, jnp.int32).at[t].add(1), i32(8, 32)),
    case("scatter-add_segment_sum", "scatter-add",
         lambda d, s: jax.ops.segment_sum(d, s, num_segments=8), f32(64, 16), i32(64)),
    case("scatter-max_segment_max", "scatter-max",
         lambda d, s: jax.ops.segment_max(d, s, num_segments=8), f32(64, 16), i32(64)),
    case("scatter", "scatter", lambda x, i, u: x.at[i].set(u), f32(8, 16), i32(3), f32(3, 16)),
    case("scatter_put_along_axis", "scatter",
         lambda x, i, u: jnp.put_along_axis(x, i, u, axis=1, inplace=False),
         f32(8, 16), i32(8, 5), f32(8, 5)),
]

# --- contractions, decompositions, fft -----------------------------------------------------------

_NHWC = ("NHWC", "HWIO", "NHWC")


def _conv(window, strides=(1, 1), padding="SAME", groups=1, dn=_NHWC):
    def fn(x, w):
        return lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=dn,
                                        feature_group_count=groups)
    return fn


def _depthwise_kernel_grad(x, w):
    return jax.grad(lambda w: jnp.sum(_conv(3, groups=8)(x, w)))(w)


LINALG = [
    case("dot_general_matmul", "dot_general", jnp.matmul, f32(8, 32), f32(32, 16)),
    case("dot_general_attention_logits", "dot_general",
         lambda q, k: jnp.einsum("bqhe,bkhe->bhqk", q, k), f32(2, 8, 4, 16), f32(2, 8, 4, 16)),
    case("dot_general_vector", "dot_general", jnp.dot, f32(32), f32(32, 16)),
    case("conv_general_dilated_3x3_same", "conv_general_dilated", _conv(3),
         f32(4, 8, 8, 3), f32(3, 3, 3, 32)),
    case("conv_general_dilated_1x1", "conv_general_dilated", _conv(1),
         f32(4, 8, 8, 16), f32(1, 1, 16, 32)),
    case("conv_general_dilated_strided", "conv_general_dilated",
         _conv(3, strides=(2, 2), padding="VALID"), f32(4, 9, 9, 3), f32(3, 3, 3, 32)),
    case("conv_general_dilated_depthwise", "conv_general_dilated", _conv(3, groups=8),
         f32(4, 8, 8, 8), f32(3, 3, 1, 16)),
    case("conv_general_dilated_batch_group", "conv_general_dilated", _depthwise_kernel_grad,
         f32(4, 8, 8, 8), f32(3, 3, 1, 16), where=lambda p: p["batch_group_count"] > 1),
    case("conv_general_dilated_nchw", "conv_general_dilated",
         _conv(3, dn=("NCHW", "OIHW", "NCHW")), f32(4, 3, 8, 8), f32(32, 3, 3, 3)),
    case("cholesky", "cholesky", jnp.linalg.cholesky, f32(3, 6, 6)),
    case("cholesky_update", "cholesky_update", linalg.cholesky_update, f32(6, 6), f32(6)),
    case("lu", "lu", jax.scipy.linalg.lu_factor, f32(3, 6, 6)),
    case("lu_pivots_to_permutation", "lu_pivots_to_permutation",
         lambda p: linalg.lu_pivots_to_permutation(p, 8), i32(3, 6)),
    case("qr", "qr", jnp.linalg.qr, f32(3, 6, 4)),
    case("eigh", "eigh", jnp.linalg.eigh, f32(3, 6, 6)),
    case("eig", "eig", jnp.linalg.eig, f32(3, 6, 6)),
    case("svd", "svd", lambda a: jnp.linalg.svd(a, full_matrices=False), f32(3, 6, 4)),
    case("schur", "schur", linalg.schur, f32(3, 6, 6)),
    case("hessenberg", "hessenberg", linalg.hessenberg, f32(3, 6, 6)),
    case("tridiagonal", "tridiagonal", linalg.tridiagonal, f32(3, 6, 6)),
    case("householder_product", "householder_product", linalg.householder_product,
         f32(3, 6, 4), f32(3, 4)),
    case("ormqr", "ormqr", linalg.ormqr, f32(3, 6, 4), f32(3, 4), f32(3, 6, 6)),
    case("symmetric_product", "symmetric_product", linalg.symmetric_product,
         f32(3, 6, 4), f32(3, 6, 6)),
    case("triangular_solve", "triangular_solve",
         lambda a, b: jax.scipy.linalg.solve_triangular(a, b, lower=True),
         f32(3, 6, 6), f32(3, 6, 2)),
    case("tridiagonal_solve", "tridiagonal_solve", linalg.tridiagonal_solve,
         f32(3, 6), f32(3, 6), f32(3, 6), f32(3, 6, 2)),
    case("fft_rfft", "fft", jnp.fft.rfft, f32(8, 64)),
    case("fft_fft2", "fft", jnp.fft.fft2, c64(3, 6, 8)),
]

# --- reductions, scans, sorts, windows -----------------------------------------------------------


def _maxpool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


REDUCE = [
    case("reduce_sum", "reduce_sum", lambda x: jnp.sum(x, axis=1), f32(8, 16)),
    case("reduce_max", "reduce_max", lambda x: jnp.max(x, axis=0), f32(8, 16)),
    case("reduce_min", "reduce_min", lambda x: jnp.min(x, axis=(0, 2)), f32(4, 8, 16)),
    case("reduce_prod", "reduce_prod", lambda x: jnp.prod(x, axis=1), f32(8, 16)),
    case("reduce_and", "reduce_and", lambda x: jnp.all(x, axis=1), pred(8, 16)),
    case("reduce_or", "reduce_or", lambda x: jnp.any(x, axis=1), pred(8, 16)),
    case("reduce_xor", "reduce_xor", lambda x: lax.reduce_xor(x, (1,)), i32(8, 16)),
    case("argmax", "argmax", lambda x: jnp.argmax(x, axis=1), f32(8, 16)),
    case("argmin", "argmin", lambda x: jnp.argmin(x, axis=0), f32(8, 16)),
    case("reduce_variadic", "reduce",
         lambda x, y: lax.reduce((x, y), (0.0, 1.0),
                                 lambda a, b: (a[0] + b[0], a[1] * b[1]), (1,)),
         f32(8, 16), f32(8, 16)),
    case("cumsum", "cumsum", lambda x: jnp.cumsum(x, axis=1), f32(8, 16)),
    case("cumprod", "cumprod", lambda x: jnp.cumprod(x, axis=0), f32(8, 16)),
    case("cummax", "cummax", lambda x: lax.cummax(x, axis=1), f32(8, 16)),
    case("cummin", "cummin", lambda x: lax.cummin(x, axis=1, reverse=True), f32(8, 16)),
    case("cumlogsumexp", "cumlogsumexp", lambda x: lax.cumlogsumexp(x, axis=1), f32(8, 16)),
    case("sort", "sort", lambda x: jnp.sort(x, axis=0), f32(8, 16)),
    case("sort_argsort", "sort", lambda x: jnp.argsort(x, axis=1), f32(8, 16)),
    case("top_k", "top_k", lambda x: lax.top_k(x, 3), f32(8, 16)),
    case("approx_top_k", "approx_top_k", lambda x: lax.approx_max_k(x, 4), f32(8, 16)),
    case("reduce_window_max", "reduce_window_max", _maxpool, f32(4, 8, 16, 3)),
    case("reduce_window_sum", "reduce_window_sum",
         lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1), "SAME"),
         f32(4, 8, 16, 3)),
    case("reduce_window_min", "reduce_window_min",
         lambda x: lax.reduce_window(x, jnp.inf, lax.min, (1, 2), (1, 2), "VALID"), f32(8, 16)),
    case("reduce_window_variadic", "reduce_window",
         lambda x, y: lax.reduce_window((x, y), (0.0, 0.0),
                                        lambda a, b: (a[0] + b[0], a[1] + b[1]),
                                        (1, 2), (1, 2), "VALID"),
         f32(8, 16), f32(8, 16)),
    case("select_and_scatter_add", "select_and_scatter_add",
         jax.grad(lambda x: jnp.sum(_maxpool(x))), f32(4, 8, 16, 3)),
    case("select_and_gather_add", "select_and_gather_add",
         lambda x: jax.jvp(_maxpool, (x,), (x,)), f32(4, 8, 16, 3)),
]

# --- identities and random numbers ---------------------------------------------------------------


def _key_then(fn):
    return lambda: fn(jax.random.key(0))


MISC = [
    case("sharding_constraint", "sharding_constraint",
         lambda x: lax.with_sharding_constraint(x, NamedSharding(_mesh(), P("data"))),
         f32(8, 16)),
    case("optimization_barrier", "optimization_barrier", lambda x, y: lax.optimization_barrier(
        (x, y)), f32(8, 16), f32(4)),
    case("device_put", "device_put", lambda x: jax.device_put(x, jax.devices()[0]), f32(8, 16)),
    case("copy", "copy", jnp.copy, f32(8, 16)),
    case("stop_gradient", "stop_gradient", lax.stop_gradient, f32(8, 16)),
    case("reshard", "reshard", lambda x: jax.sharding.reshard(x, P("data")), f32(8, 16),
         context=_explicit_mesh),
    case("layout_constraint", "layout_constraint",
         lambda x: with_layout_constraint(x, Layout((0, 1))), f32(8, 16)),
    case("name", "name", lambda x: jax.ad_checkpoint.checkpoint_name(x, "h"), f32(8, 16)),
    case("random_seed", "random_seed", lambda s: jax.random.key(s), i32()),
    case("random_split", "random_split", _key_then(lambda k: jax.random.split(k, 4))),
    case("random_fold_in", "random_fold_in", _key_then(lambda k: jax.random.fold_in(k, 3))),
    case("random_bits", "random_bits", _key_then(lambda k: jax.random.bits(k, (8, 16)))),
    case("random_bits_batched_keys", "random_bits",
         _key_then(lambda k: jax.vmap(lambda k: jax.random.bits(k, (16,)))(
             jax.random.split(k, 8)))),
    case("random_wrap", "random_wrap", lambda d: jax.random.wrap_key_data(d), u32(8, 2)),
    case("random_unwrap", "random_unwrap",
         _key_then(lambda k: jax.random.key_data(jax.random.split(k, 8)))),
    case("random_clone", "random_clone", _key_then(jax.random.clone)),
    case("random_gamma", "random_gamma", lambda a: jax.random.gamma(jax.random.key(0), a),
         f32(8)),
    case("threefry2x32", "threefry2x32", jax.extend.random.threefry_2x32, u32(2), u32(8)),
    case("rng_bit_generator", "rng_bit_generator",
         lambda k: lax.rng_bit_generator(k, (8, 16)), u32(4)),
    case("rng_uniform", "rng_uniform", lambda: lax.rng_uniform(0.0, 1.0, (8, 16))),
]


# --- primitives real libraries emit: grouped matmuls, manual SPMD, equinox's internals ---------


def _eqx_loop(x):
    """An equinox checkpointed while loop that writes a buffer (diffrax's save path): emits
    select_if_vmap, unvmap_any, nonbatchable and maybe_set (vprim once vmapped)."""
    import equinox.internal as eqxi

    def body(c):
        i, y, ys = c
        return i + 1, y * 0.9 + x, ys.at[i].set(y)

    init = (0, x, jnp.zeros((8,) + x.shape, x.dtype))
    return eqxi.while_loop(lambda c: c[0] < 5, body, init, max_steps=8, kind="checkpointed",
                           buffers=lambda c: c[2])[2]


def _ragged(dn):
    from jax._src.lax.lax import RaggedDotDimensionNumbers

    return lambda a, b, g: lax.ragged_dot_general(
        a, b, g, RaggedDotDimensionNumbers(*dn))


def _shard_map_double(x):
    return jax.shard_map(lambda a: a * 2, mesh=_mesh(), in_specs=P("data"),
                         out_specs=P("data"))(x)


LIBRARIES = [
    case("ragged_dot", "ragged_dot_general", lax.ragged_dot, f32(16, 8), f32(4, 8, 6), i32(4)),
    case("ragged_dot_batched", "ragged_dot_general",
         _ragged(((((2,), (2,)), ((0,), (1,))), (1,), (0,))),
         f32(16, 32, 64), f32(4, 16, 64, 8), i32(16, 4)),
    case("ragged_dot_contracting", "ragged_dot_general",
         _ragged(((((1,), (0,)), ((), ())), (1,), ())), f32(16, 8), f32(8, 6), i32(4)),
    case("shard_map", "shard_map", _shard_map_double, f32(16, 32)),
    # a collective over vmap's mapped axis: a reduction over that positional dim
    case("psum_vmap", "psum", jax.vmap(lambda x: lax.psum(x, "e"), axis_name="e"), f32(2, 8, 16)),
    case("pmax_vmap", "pmax", jax.vmap(lambda x: lax.pmax(x, "e"), axis_name="e", in_axes=1),
         f32(8, 2, 16)),
    case("pmin_vmap", "pmin", jax.vmap(lambda x: lax.pmin(x, "e"), axis_name="e"), f32(2, 8)),
    # host callbacks that only observe: gathered to device 0 unless partitioned=True
    case("debug_print", "debug_print", lambda x: jax.debug.print("{x}", x=x), f32(8, 16)),
    case("debug_print_partitioned", "debug_print",
         lambda x: jax.debug.print("{x}", x=x, partitioned=True), f32(8, 16)),
    case("debug_callback", "debug_callback",
         lambda x: jax.debug.callback(lambda a: None, x), f32(8, 16)),
    case("debug_callback_partitioned", "debug_callback",
         lambda x: jax.debug.callback(lambda a: None, x, partitioned=True), f32(8, 16)),
    case("platform_index", "platform_index", lambda a: lax.platform_dependent(
        a, cpu=lambda a: a * 2.0, default=lambda a: a), f32(8, 8)),
    case("empty", "empty", lambda: lax.empty((8, 16), jnp.float32)),
    # the gradient of a cond whose branches keep different residuals fills the gaps with empty2
    case("empty2", "empty2", jax.grad(lambda x: lax.cond(
        x.sum() > 0, lambda x: jnp.sin(x) * x, lambda x: x * 2.0, x).sum()), f32(8)),
    case("nonbatchable", "nonbatchable",
         lambda x: __import__("equinox").internal.nonbatchable(x), f32(8, 16)),
    case("unvmap_any", "unvmap_any", lambda x: __import__("equinox").internal.unvmap_any(x > 0),
         f32(8, 16)),
    case("unvmap_all", "unvmap_all", lambda x: __import__("equinox").internal.unvmap_all(x > 0),
         f32(8, 16)),
    case("unvmap_max", "unvmap_max", lambda x: __import__("equinox").internal.unvmap_max(x),
         i32(8, 16)),
    case("select_if_vmap", "select_if_vmap",
         lambda p, x, y: __import__("equinox").internal.select_if_vmap_p.bind(p, x, y),
         pred(), f32(8, 16), f32(8, 16)),
    # cuDNN's flash attention as a GPU traces it (grouped-query: 4 q heads over 2 kv heads)
    case("cudnn_attention_fwd", "dot_product_attention_fwd_wrapper", newer_jax.cudnn_attention,
         bf16(2, 128, 4, 64), bf16(2, 128, 2, 64), bf16(2, 128, 2, 64)),
    case("cudnn_attention_bwd", "dot_product_attention_bwd_wrapper",
         newer_jax.cudnn_attention_step, bf16(2, 128, 4, 64), bf16(2, 128, 2, 64),
         bf16(2, 128, 2, 64)),
    # JAX 0.11's tanh derivative
    case("one_minus_square", "one_minus_square", newer_jax.one_minus_square, f32(8, 16)),
    case("maybe_set", "maybe_set", _eqx_loop, f32(4, 3)),
    case("vprim", "vprim", jax.vmap(_eqx_loop), f32(2, 4, 3)),
]

CASES = ELEMENTWISE + SHAPE + INDEXING + LINALG + REDUCE + MISC + LIBRARIES


# --- machinery -----------------------------------------------------------------------------------

def _sub_jaxprs(params):
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(getattr(item, "jaxpr", None), "eqns"):
                yield item.jaxpr


def find_eqn(jaxpr, primitive, where=lambda params: True):
    """The first eqn of `primitive` (whose params satisfy `where`) in program order, looking
    inside nested jaxprs."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == primitive and where(eqn.params):
            return eqn
        for sub in _sub_jaxprs(eqn.params):
            found = find_eqn(sub, primitive, where)
            if found is not None:
                return found
    return None


def _shape(v):
    return tuple(int(d) for d in getattr(v.aval, "shape", ()))


def eqn_of(c: Case):
    """The case's eqn as (operand shapes, result shapes, params)."""
    with c.context():
        closed = jax.make_jaxpr(c.fn)(*c.args)
    eqn = find_eqn(closed.jaxpr, c.primitive, c.where)
    assert eqn is not None, f"{c.id}: no {c.primitive} eqn in\n{closed}"
    return [_shape(v) for v in eqn.invars], [_shape(v) for v in eqn.outvars], eqn.params


def rule_of(c: Case) -> OpRule:
    return rule_for(c.primitive, *eqn_of(c))


def _read_golden():
    table = {}
    if GOLDEN.exists():
        for line in GOLDEN.read_text().splitlines():
            if line and not line.startswith("#"):
                key, _, text = line.partition(": ")
                table[key] = text
    return table


@pytest.fixture(scope="module")
def golden():
    if UPDATE:
        lines = ["# Sharding rules, one per case of tests/test_rules.py: `case_id: rule`.",
                 "# Regenerate: TOAST_UPDATE_GOLDEN=1 pytest tests/test_rules.py; read the diff."]
        lines += [f"{c.id}: {rule_of(c).to_text()}" for c in CASES]
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text("\n".join(lines) + "\n")
    return _read_golden()


# --- tests ---------------------------------------------------------------------------------------

def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_golden(c, golden):
    assert c.id in golden, f"no golden line for {c.id}: run with TOAST_UPDATE_GOLDEN=1"
    assert rule_of(c).to_text() == golden[c.id]


def test_every_rule_has_a_golden_case():
    covered = {c.primitive for c in CASES}
    missing = sorted(set(RULES) - set(REGION_PRIMITIVES) - covered)
    assert not missing, f"rules without a golden case in tests/test_rules.py: {missing}"


def test_golden_file_has_no_stale_lines(golden):
    assert set(golden) == {c.id for c in CASES}


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_rule_is_well_formed(c):
    check_well_formed(rule_of(c), c.id)


def check_well_formed(rule: OpRule, where: str, allow_fallback: bool = False):
    assert allow_fallback or not rule.fallback, f"{where}: fell back to the conservative rule"
    assert len(rule.sizes) == len(rule.kinds)
    assert all(isinstance(k, FactorKind) for k in rule.kinds)
    assert all(s > 1 for s in rule.sizes), f"{where}: a factor of size <= 1"
    used = set()
    for tensor in (*rule.operands, *rule.results, *rule.boundary):
        seen = [f for dim in tensor for f in dim]
        assert len(seen) == len(set(seen)), f"{where}: a factor maps two dims of one tensor"
        used.update(seen)
    assert used == set(range(rule.num_factors)), f"{where}: a factor maps no dim"


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_factor_sizes_multiply_to_dims(c):
    ins, outs, params = eqn_of(c)
    rule = rule_for(c.primitive, ins, outs, params)
    for side, tensors in zip((ins, outs), (rule.operands, rule.results)):
        assert len(side) == len(tensors)
        for shape, dims in zip(side, tensors):
            assert len(shape) == len(dims)
            for n, factors in zip(shape, dims):
                if factors:
                    assert int(np.prod([rule.sizes[f] for f in factors])) == n, (c.id, shape)


# The statements the whole analysis leans on, spelled out (a regenerated golden file that broke
# one of them would otherwise pass).
@pytest.mark.parametrize("name, ins, outs, params, text", [
    ("dot_general", [(8, 32), (32, 16)], [(8, 16)], {"dimension_numbers": (((1,), (0,)), ((), ()))},
     "([i, j], [j, k])->([i, k]) {i=8, j=32, k=16} reduction={j}"),
    ("reshape", [(8, 64)], [(8, 4, 16)], {"new_sizes": (8, 4, 16), "dimensions": None},
     "([i, jk])->([i, j, k]) {i=8, j=4, k=16}"),
    ("reshape", [(6, 4)], [(4, 6)], {"new_sizes": (4, 6), "dimensions": None},
     "([i, j])->([k, l]) {i=6, j=4, k=4, l=6} need_replication={i, j, k, l}"),
    # a reshape of a transposed view (a grouped convolution's kernel gradient): the factors
    # follow the transposed order back to the operand's own dims
    ("reshape", [(4, 6)], [(24,)], {"new_sizes": (24,), "dimensions": (1, 0)},
     "([j, i])->([ij]) {i=6, j=4}"),
    ("reshape", [(3, 3, 1, 32, 1)], [(3, 3, 32, 1)],
     {"new_sizes": (3, 3, 32, 1), "dimensions": (0, 1, 3, 2, 4)},
     "([i, j, 1, k, 1])->([i, j, k, 1]) {i=3, j=3, k=32}"),
    ("broadcast_in_dim", [(1, 16)], [(8, 16)], {"broadcast_dimensions": (0, 1), "shape": (8, 16)},
     "([1, j])->([i, j]) {i=8, j=16}"),
    ("add", [(8, 1), (1, 16)], [(8, 16)], {}, "([i, 1], [1, j])->([i, j]) {i=8, j=16}"),
    ("cumsum", [(8, 16)], [(8, 16)], {"axis": 1, "reverse": False},
     "([i, j])->([i, j]) {i=8, j=16} need_replication={j}"),
])
def test_key_semantics(name, ins, outs, params, text):
    assert rule_for(name, ins, outs, params).to_text() == text


@pytest.mark.parametrize("name", sorted(set(RULES) - set(REGION_PRIMITIVES)))
def test_rules_never_raise(name):
    """Shapes and params a rule does not expect give the conservative rule, not an exception."""
    for ins, outs, params in [
        ([(3, 5)], [(7,)], {}),
        ([(3, 5), (2,)], [(3, 5), (4, 4)], {"axes": (9,), "dimension": 4, "axis": 7}),
        ([], [], {}),
    ]:
        rule = rule_for(name, ins, outs, params)
        assert isinstance(rule, OpRule)
        check_well_formed(rule, name, allow_fallback=True)


def test_unmappable_shapes_fall_back():
    rule = rule_for("dot_general", [(8, 32), (16, 4)], [(8, 4)],
                    {"dimension_numbers": (((1,), (0,)), ((), ()))})
    assert rule.fallback and rule == conservative_rule([(8, 32), (16, 4)], [(8, 4)])
