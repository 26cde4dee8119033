"""Find every collective in an HLO module's text (DESIGN.md §9).

`parse_collectives` finds every collective in a module's text and says which mesh axes it runs
over and how many times it executes.

Replica groups and device ids: `_replica_groups`; matching them to the user's mesh: `_mesh_grid`;
how many times a computation runs: `_trip_counts`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

from ._collectives import Collective, _collective_kind
from ._hlo_text import (
    _QUOTED,
    _Instruction,
    _Module,
    _ints,
    _parse_module,
    _shape_bytes,
    _shape_dtypes,
    _split_top_level,
)
from ._mesh_grid import _MeshGrid
from ._replica_groups import _CHANNEL_ID, _IdSpace, _group_mode, _written_groups
from ._trip_counts import _CALLED_COMPUTATION, _computation_multipliers

# --- regexes, each with an example of what it reads ------------------------------------------

# dimensions={1}
_DIMENSIONS = re.compile(r"\bdimensions=\{(?P<dims>[\d,\s]*)\}")

# source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
_SOURCE_TARGET_PAIRS = re.compile(
    r"\bsource_target_pairs=\{(?P<body>(?:\s*\{\s*\d+\s*,\s*\d+\s*\}\s*,?)*)\s*\}"
)
_PAIR = re.compile(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}")

# slice_sizes={{4}}: the attribute of an in-place collective-permute
_SLICE_SIZES = re.compile(r"\bslice_sizes=")

# metadata={op_name="jit(loss)/transpose(jvp())/dot_general" stack_frame_id=3}
_OP_NAME = re.compile(r'\bop_name="(?P<op_name>(?:[^"\\]|\\.)*)"')


# --- the parser ------------------------------------------------------------------------------


def parse_collectives(
    hlo_text: str,
    device_grid: Any,
    axis_names: Sequence[str],
) -> tuple[Collective, ...]:
    """Every collective in an HLO module's text, in module order.

    hlo_text: `compiled.as_text()`, or any HLO module / computation text.
    device_grid: array shaped like the mesh holding the device id (as HLO numbers devices:
        position in the executable's device assignment) at each mesh position; for `jax.jit`
        over a mesh that is `np.arange(mesh.size).reshape(mesh.devices.shape)`.
    axis_names: the mesh's axis names, one per dimension of `device_grid`.
    """
    mesh = _MeshGrid.of(device_grid, axis_names)
    module = _parse_module(hlo_text)
    ids = _IdSpace(module.replica_count, module.num_partitions, tuple(sorted(mesh.coords)))
    multipliers = _computation_multipliers(module)
    wrapped = _wrapped_by_collective_starts(module)
    found = []
    for computation in module.computations:
        if computation.name in wrapped:
            continue
        shapes = {i.name: i.shape for i in computation.instructions}
        # An async -done takes its -start as operand and has the collective's result shape.
        done_shapes = {
            i.operands[0][0]: i.shape
            for i in computation.instructions
            if i.opcode.endswith("-done") and i.operands
        }
        for instruction in computation.instructions:
            kind_async = _collective_kind(instruction.opcode)
            if kind_async is None:
                continue
            kind, is_async = kind_async
            result_shape = (
                _async_result_shape(instruction, kind, done_shapes) if is_async
                else instruction.shape
            )
            collective = _read_collective(
                instruction, kind, computation.name, shapes, result_shape, ids, mesh
            )
            found.append(dataclasses.replace(collective, multiplier=multipliers[computation.name]))
    return tuple(found)


def _read_collective(
    instruction: _Instruction,
    kind: str,
    computation: str,
    shapes: Mapping[str, str],
    result_shape: str,
    ids: _IdSpace,
    mesh: _MeshGrid,
) -> Collective:
    line = instruction.line
    operands = instruction.operands
    attributes = _QUOTED.sub('""', instruction.attributes)
    if kind == "collective-permute" and _SLICE_SIZES.search(attributes):
        # an in-place permute also takes an output buffer and offsets: it sends its first
        # operand (a combined one, CollectivePermuteCombiner's, sends every operand)
        operands = operands[:1]
    operand_shapes = []
    for name, inline in operands:
        shape = inline if inline is not None else shapes.get(name)
        if shape is None:
            raise ValueError(
                f"Operand %{name} of {kind} %{instruction.name} is not defined in computation "
                f"{computation!r}; cannot size it:\n  {line.strip()}"
            )
        operand_shapes.append(shape)

    mode = _group_mode(attributes, kind)
    groups: list[list[int]] = []
    pairs: list[tuple[int, int]] = []
    if kind == "collective-permute":
        written = _SOURCE_TARGET_PAIRS.search(attributes)
        raw = [(int(a), int(b)) for a, b in _PAIR.findall(written["body"])] if written else []
        pairs = ids.pairs(raw, mode)
        axes = mesh.axes_of_pairs(pairs)
    else:
        groups = ids.groups(_written_groups(attributes, line), mode)
        axes = mesh.axes_of_groups(groups)

    channel = _CHANNEL_ID.search(attributes)
    dims = _DIMENSIONS.search(attributes)
    op_name = _OP_NAME.search(instruction.attributes)
    return Collective(
        kind=kind,
        name=instruction.name,
        computation=computation,
        operand_bytes=sum(_shape_bytes(s, line) for s in operand_shapes),
        result_bytes=_shape_bytes(result_shape, line),
        dtypes=tuple(dict.fromkeys(d for s in operand_shapes for d in _shape_dtypes(s))),
        group_size=len(groups[0]) if groups else 0,
        groups=tuple(tuple(g) for g in groups),
        axes=axes,
        pairs=tuple(pairs),
        dimensions=tuple(_ints(dims["dims"])) if dims else (),
        channel_id=int(channel.group(1)) if channel else None,
        op_name=op_name["op_name"] if op_name else "",
    )


def _async_result_shape(
    instruction: _Instruction, kind: str, done_shapes: Mapping[str, str]
) -> str:
    """The result of an async start: the shape of its -done."""
    if instruction.name in done_shapes:
        return done_shapes[instruction.name]
    # No -done in sight (a snippet): the start's tuple holds (operand, result, context...).
    if instruction.shape.startswith("(") and kind in ("all-gather", "collective-permute"):
        elements = _split_top_level(instruction.shape[1:-1])
        return elements[1] if len(elements) > 1 else instruction.shape
    return instruction.shape


def _wrapped_by_collective_starts(module: _Module) -> set[str]:
    """Computations that a collective's async start wraps (`all-to-all-start(...),
    calls=%wrapped`): the start already stands for the collective inside them."""
    wrapped = set()
    for computation in module.computations:
        for instruction in computation.instructions:
            kind_async = _collective_kind(instruction.opcode)
            if kind_async and kind_async[1]:
                attributes = _QUOTED.sub('""', instruction.attributes)
                called = _CALLED_COMPUTATION.finditer(attributes)
                wrapped |= {m["name"] for m in called if m["role"] == "calls"}
    return wrapped
