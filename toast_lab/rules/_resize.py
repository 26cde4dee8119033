"""One op run at smaller shapes: the params that name sizes, rewritten for fewer examples.

Micro-batching replays a step's per-example ops on a slice of the batch: the same primitives
on arrays whose batch dim is shorter. Most primitives take every size from their operands;
the ones in RESIZERS name sizes in their params (a broadcast's shape, a slice's limits), and
their rule here rewrites them from the new operand and result shapes, or raises ResizeError
where the op cannot run on fewer examples and mean the same thing (a slice that keeps some
examples only, a count along the batch, random numbers drawn in the batch's shape).

A resizer is a small pure function `(params, old, new) -> params`, where `old` and `new` are
`Shapes` (operand and result shapes before and after); like the sharding rules it is keyed by
primitive name. SHAPE_FREE names the primitives whose params hold no sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ._elementwise import NARY, UNARY

Shape = tuple[int, ...]


class ResizeError(ValueError):
    """An op that cannot run on fewer examples and mean the same: the message says why."""


@dataclass(frozen=True)
class Shapes:
    """The operand and result shapes of one op."""

    operands: tuple[Shape, ...]
    results: tuple[Shape, ...]


# Primitives whose params name no size: they run on smaller operands as they are. Region
# primitives (scan, while, cond) are not here: a replay rebuilds their bodies.
SHAPE_FREE = frozenset(UNARY + NARY) | frozenset({
    "dot_general", "ragged_dot_general", "transpose", "squeeze", "expand_dims",
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "reduce_xor", "argmax", "argmin", "copy", "copy_p", "optimization_barrier",
    "sharding_constraint", "device_put", "dynamic_update_slice", "scatter", "scatter-add",
    "scatter_add", "scatter-mul", "scatter_mul", "scatter-min", "scatter_min", "scatter-max",
    "scatter_max", "random_wrap", "random_unwrap", "random_seed", "random_fold_in",
    "threefry2x32", "custom_jvp_call", "custom_vjp_call",
    "name",  # jax.ad_checkpoint.checkpoint_name: its param is the name a remat policy reads
    # cuDNN's flash attention (jax.nn.dot_product_attention(implementation="cudnn")): its
    # params are the scale, mask type, layout and dropout; every size comes from q, k and v
    "dot_product_attention_fwd_wrapper", "dot_product_attention_bwd_wrapper",
})

Resizer = Callable[[Mapping[str, Any], Shapes, Shapes], dict]
RESIZERS: dict[str, Resizer] = {}


def resizer(*names: str):
    def register(fn: Resizer) -> Resizer:
        for name in names:
            RESIZERS[name] = fn
        return fn
    return register


def resized_params(primitive: str, params: Mapping[str, Any], old: Shapes, new: Shapes) -> dict:
    """The params with which `primitive` computes the `new` result shapes from the `new`
    operand shapes, as it computed `old` from `old`. Raises ResizeError where it cannot."""
    if old == new or primitive in SHAPE_FREE:
        return dict(params)
    rule = RESIZERS.get(primitive)
    if rule is None:
        raise ResizeError(f"toast-lab does not know how {primitive} runs on fewer examples "
                          f"(its params may name sizes)")
    return rule(params, old, new)


def changed_dims(old: Shape, new: Shape) -> list[int]:
    return [d for d, (a, b) in enumerate(zip(old, new)) if a != b]


@resizer("broadcast_in_dim")
def _broadcast(params, old, new):
    return {**params, "shape": tuple(new.results[0])}


@resizer("reshape")
def _reshape(params, old, new):
    if params.get("dimensions") is not None:
        raise ResizeError("a reshape that transposes (its `dimensions`) on the batch")
    return {**params, "new_sizes": tuple(new.results[0])}


@resizer("iota")
def _iota(params, old, new):
    if params["dimension"] in changed_dims(old.results[0], new.results[0]):
        raise ResizeError("counts the examples (an iota along the batch): a micro-batch would "
                          "count its own examples from 0")
    return {**params, "shape": tuple(new.results[0])}


def _slice_sizes(params, old, new, batching: tuple[int, ...]) -> dict:
    sizes = list(params["slice_sizes"])
    for d in changed_dims(old.operands[0], new.operands[0]):
        if d in batching:
            continue  # one example at a time, per example: the size stays 1
        if sizes[d] != old.operands[0][d]:
            raise ResizeError("takes some of the examples (a gather or dynamic slice along the "
                              "batch)")
        sizes[d] = new.operands[0][d]
    return {**params, "slice_sizes": tuple(sizes)}


@resizer("gather")
def _gather(params, old, new):
    numbers = params["dimension_numbers"]
    return _slice_sizes(params, old, new, tuple(getattr(numbers, "operand_batching_dims", ())))


@resizer("dynamic_slice")
def _dynamic_slice(params, old, new):
    return _slice_sizes(params, old, new, ())


@resizer("slice")
def _slice(params, old, new):
    limits = list(params["limit_indices"])
    strides = params.get("strides") or (1,) * len(limits)
    for d in changed_dims(old.operands[0], new.operands[0]):
        if params["start_indices"][d] != 0 or limits[d] != old.operands[0][d] or strides[d] != 1:
            raise ResizeError("slices the batch (keeps some examples only)")
        limits[d] = new.operands[0][d]
    return {**params, "limit_indices": tuple(limits)}


@resizer("pad")
def _pad(params, old, new):
    for d in changed_dims(old.operands[0], new.operands[0]):
        if tuple(params["padding_config"][d]) != (0, 0, 0):
            raise ResizeError("pads the batch (adds examples)")
    return dict(params)


def _not_along(key: str, what: str) -> Resizer:
    """A resizer for ops that work along one dim (`params[key]`): fine unless it is a batch
    dim."""

    def rule(params, old, new):
        along = params[key]
        along = along if isinstance(along, (tuple, list)) else (along,)
        shapes = old.operands or old.results
        new_shapes = new.operands or new.results
        changed = {d for a, b in zip(shapes, new_shapes) for d in changed_dims(a, b)}
        if changed & set(along):
            raise ResizeError(f"{what} along the batch")
        return dict(params)

    return rule


resizer("concatenate")(_not_along("dimension", "joins arrays"))
resizer("split")(_not_along("axis", "splits an array"))
resizer("rev")(_not_along("dimensions", "reverses the examples"))
resizer("sort")(_not_along("dimension", "sorts"))
resizer("top_k")(_not_along("axis", "takes the top k"))
for _cumulative in ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"):
    resizer(_cumulative)(_not_along("axis", "accumulates"))


@resizer("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window",
         "select_and_scatter_add", "select_and_gather_add")
def _window(params, old, new):
    window, strides = params["window_dimensions"], params["window_strides"]
    padding = params["padding"]
    dilations = [params.get(k) for k in ("base_dilation", "window_dilation")]
    for d in changed_dims(old.operands[0], new.operands[0]):
        dilated = any(dil is not None and dil[d] != 1 for dil in dilations)
        if window[d] != 1 or strides[d] != 1 or tuple(padding[d]) != (0, 0) or dilated:
            raise ResizeError("pools across examples (a window along the batch)")
    return dict(params)


@resizer("conv_general_dilated")
def _conv(params, old, new):
    """Fewer examples in the batch dim of the image, or in the features a convolution contracts
    (the kernel's gradient contracts the batch there): never in a window."""
    numbers = params["dimension_numbers"]
    lhs, rhs = (numbers.lhs_spec, numbers.rhs_spec) if numbers is not None else \
        ((0, 1), (0, 1))
    lhs_changed = set(changed_dims(old.operands[0], new.operands[0]))
    rhs_changed = set(changed_dims(old.operands[1], new.operands[1]))
    grouped = params.get("batch_group_count", 1) != 1 or (
        params.get("feature_group_count", 1) != 1 and lhs[1] in lhs_changed)
    if grouped or not lhs_changed <= {lhs[0], lhs[1]} or not rhs_changed <= {rhs[0], rhs[1]}:
        raise ResizeError("a convolution whose window or groups run along the batch")
    return dict(params)


def _random(params, old, new):
    raise ResizeError("draws random numbers in the batch's shape: a micro-batch would draw "
                      "other ones")


for _draw in ("random_bits", "rng_bit_generator", "rng_uniform", "random_split",
              "random_gamma"):
    resizer(_draw)(_random)
