"""Arguments against the program they should match: what a plan for one program may be run
on (plan.jit, tl.verify). A plan replays the traced shapes (a mean divides by the traced
batch), so other shapes would run wrong, or fail deep inside jax."""

from __future__ import annotations

from typing import Mapping

import jax
import numpy as np

from ._program import Program


def check_args(prog: Program, args: tuple, kwargs: Mapping | None, caller: str,
               advice: str) -> None:
    """Raises ValueError naming the first argument leaf whose structure, shape or dtype is not
    the traced program's; the message starts with `caller` and ends with `advice`. Leaves may
    be arrays, ShapeDtypeStructs or tracers."""
    leaves, tree = jax.tree_util.tree_flatten_with_path((tuple(args), dict(kwargs or {})))
    if tree != prog.in_tree:
        raise ValueError(
            f"{caller}: the arguments are not shaped like those {prog.fn_name!r} was traced "
            f"with ({len(leaves)} leaves vs {len(prog.inputs)}): expected a pytree like "
            f"{_short(str(prog.in_tree))}, got {_short(str(tree))}. {advice}")
    for (path, leaf), v, name in zip(leaves, prog.inputs, prog.input_names):
        val = prog.values[v]
        shape = tuple(np.shape(leaf))
        # Python scalars take the traced dtype (weak typing): only their shape counts
        dtype = getattr(leaf, "dtype", None) or val.dtype
        if shape != val.shape or not same_dtype(dtype, val.dtype):
            raise ValueError(
                f"{caller}: argument {name or jax.tree_util.keystr(path)} is "
                f"{_dtype_name(dtype)}{list(shape)} but {prog.fn_name!r} was traced with "
                f"{_dtype_name(val.dtype)}{list(val.shape)}. {advice}")


def same_dtype(a, b) -> bool:
    """Equal after JAX's canonicalization (float64 NumPy arrays trace as float32 without x64)."""
    try:
        return jax.dtypes.canonicalize_dtype(a) == jax.dtypes.canonicalize_dtype(b)
    except (TypeError, ValueError):  # extended dtypes (PRNG keys)
        return str(a) == str(b)


def _dtype_name(dtype) -> str:
    return getattr(dtype, "name", str(dtype))


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
