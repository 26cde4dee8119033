"""Logical axis names that a library already keeps on its parameters, read as dim names.

flax.nnx's `nnx.with_partitioning(init, ("embed", "mlp"))` stores the names in the Variable's
metadata: under `out_sharding` on flax 0.12, `sharding_names` or `sharding` before it; nnx's
optimizer keeps them on its moments too. flax.linen's `nn.with_partitioning` and
`nn.with_logical_partitioning` box a parameter in `nn.Partitioned` / `nn.LogicallyPartitioned`,
whose `.names` hold them. A step that takes an nnx state (or Variables, or boxed linen
params) thus names its dims without `dim_names`; the user's `dim_names` still come first
(analysis/_names.py).
"""

from __future__ import annotations

import sys

import jax

# nnx metadata keys that hold the names, newest flax first
_NNX_KEYS = ("out_sharding", "sharding_names", "sharding")


def annotated_names(tree) -> list[tuple[str | None, ...] | None]:
    """Per leaf of `tree` (in jax's flattening order): the logical names its box gives its dims,
    one per dim, or None where it has no box or the names do not fit its shape.

    Never imports flax: a tree can only hold flax's boxes when flax is already imported."""
    leaves = jax.tree_util.tree_leaves(tree)
    boxes = _box_types()
    if not boxes:
        return [None] * len(leaves)
    out: list[tuple[str | None, ...] | None] = []
    for node in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, boxes)):
        if not isinstance(node, boxes):
            out.append(None)
            continue
        names = _names_of(node)
        for leaf in jax.tree_util.tree_leaves(node):
            fits = names is not None and len(names) == len(jax.numpy.shape(leaf))
            out.append(names if fits and any(n is not None for n in names) else None)
    # a box whose own flattening differs from the tree's would misalign every name after it
    return out if len(out) == len(leaves) else [None] * len(leaves)


def _box_types() -> tuple[type, ...]:
    """flax's box types among the modules already imported (importing nnx for a linen user
    would cost a second)."""
    types = []
    meta = sys.modules.get("flax.core.meta")
    if meta is not None and isinstance(getattr(meta, "Partitioned", None), type):
        types.append(meta.Partitioned)  # nn.LogicallyPartitioned is a subclass
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None:
        # flax before 0.11 split Variable and VariableState; 0.12 keeps the old name as a
        # deprecated alias, which vars() reads without the warning
        found = (vars(nnx).get("Variable"), vars(nnx).get("VariableState"))
        types += [t for t in dict.fromkeys(found) if isinstance(t, type)]
    return tuple(types)


def _names_of(box) -> tuple[str | None, ...] | None:
    names = getattr(box, "names", None)  # linen's Partitioned
    if names is None:
        metadata = _nnx_metadata(box)
        names = next((metadata[k] for k in _NNX_KEYS if metadata.get(k) is not None), None)
    names = getattr(names, "spec", names)  # a NamedSharding: its PartitionSpec
    if isinstance(names, jax.sharding.PartitionSpec):  # no tuple since jax 0.6
        names = tuple(names)
    if not isinstance(names, (tuple, list)):
        return None
    return tuple(_one_name(n) for n in names)


def _nnx_metadata(box) -> dict:
    get = getattr(box, "get_metadata", None)
    try:
        metadata = get() if callable(get) else getattr(box, "metadata", None)
    except Exception:  # a name is a courtesy: never let a library's accessor break tracing
        return {}
    return metadata if isinstance(metadata, dict) else {}


def _one_name(entry) -> str | None:
    """A dim's name: the logical axis, or 'a+b' for a dim spread over two (P(('a', 'b')));
    None for an unnamed or unconstrained dim."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, (tuple, list)) and entry and all(isinstance(e, str) for e in entry):
        return "+".join(entry)
    return None
