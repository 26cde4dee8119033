"""What a collective of a compiled module is, and totals of them per kind and mesh axes."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from ..cost import COLLECTIVE_KINDS as MODELED_KINDS

# What XLA emits: the kinds the cost model prices (collective-permute where a shard_map body
# runs a ppermute and where XLA picks one to reshard that the model knows: a dim handed to
# other axes, a matmul's reduced shard, a scatter's regrouped indices, a re-tiled batched
# gather's labels), and the one it does not.
XLA_COLLECTIVE_KINDS = MODELED_KINDS + ("collective-broadcast",)
assert "collective-permute" in XLA_COLLECTIVE_KINDS

# Which size `Collective.bytes` reports: the whole buffer the collective works on, per device.
# all-gather's input is one shard of it, so it is priced by its result; the others by their input.
_PRICED_BY_RESULT = frozenset({"all-gather"})


@dataclass(frozen=True)
class Collective:
    """One collective instruction of a compiled module, per device.

    kind: one of XLA_COLLECTIVE_KINDS (an async -start/-done pair is one collective, named by its
        start).
    name / computation: the HLO instruction and the computation it sits in.
    operand_bytes / result_bytes: per device, summed over tuple elements.
    dtypes: the element types of its operands, in order, without repeats ("f32", "bf16", ...).
    groups: device ids that communicate (empty for collective-permute: see `pairs`).
    group_size: devices per group (0 for collective-permute).
    axes: the mesh axes each group spans, in mesh order, e.g. ("data",) or ("data", "model");
        empty when the groups are not whole mesh axes (a part of an axis, or devices outside the
        grid) or are single devices. For collective-permute: the axes its pairs move along.
    pairs: (source, target) device ids of a collective-permute.
    multiplier: how many times it executes per step: the product of the known trip counts of
        the while loops around it (as XLA records for `lax.scan`); 1 where a trip count is
        unknown.
    dimensions: the gathered / scattered / split dimensions where the op has them.
    channel_id: XLA's channel id, or None.
    op_name: JAX's name for the op that caused it, from the HLO metadata.
    """

    kind: str
    name: str
    computation: str
    operand_bytes: int
    result_bytes: int
    dtypes: tuple[str, ...]
    group_size: int
    groups: tuple[tuple[int, ...], ...]
    axes: tuple[str, ...]
    multiplier: int = 1
    pairs: tuple[tuple[int, int], ...] = ()
    dimensions: tuple[int, ...] = ()
    channel_id: int | None = None
    op_name: str = ""

    @property
    def dtype(self) -> str:
        """The first operand's element type."""
        return self.dtypes[0] if self.dtypes else ""

    @property
    def bytes(self) -> int:
        """Per-device bytes of the whole buffer, the size an alpha-beta model prices.

        all-gather: result bytes (the gathered buffer); all-reduce, reduce-scatter, all-to-all,
        collective-permute, collective-broadcast: operand bytes. One execution.
        """
        return self.result_bytes if self.kind in _PRICED_BY_RESULT else self.operand_bytes

    @property
    def total_bytes(self) -> int:
        """`bytes` times `multiplier`: per device, over a whole step."""
        return self.bytes * self.multiplier

    def __repr__(self) -> str:
        where = f"over {self.axes}" if self.axes else "over no whole mesh axes"
        times = f" x{self.multiplier}" if self.multiplier != 1 else ""
        return (
            f"Collective({self.kind} {self.name!r} {where}, {self.bytes} B{times}, "
            f"group_size={self.group_size}, in {self.computation!r})"
        )


@dataclass(frozen=True)
class CollectiveTotal:
    """All collectives of one kind over the same axes, over a step.

    count: executions (the sum of the collectives' multipliers).
    bytes: per device, the sum of `Collective.total_bytes` (see `Collective.bytes`).
    """

    count: int
    bytes: int


def summarize_collectives(
    collectives: Iterable[Collective],
) -> dict[tuple[str, tuple[str, ...]], CollectiveTotal]:
    """Totals per (kind, axes), sorted by kind then axes."""
    counts: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
    sizes: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
    for c in collectives:
        counts[(c.kind, c.axes)] += c.multiplier
        sizes[(c.kind, c.axes)] += c.total_bytes
    return {key: CollectiveTotal(counts[key], sizes[key]) for key in sorted(counts)}


def _collective_kind(opcode: str) -> tuple[str, bool] | None:
    """(kind, is an async start) for a collective opcode; None for anything else (and -done)."""
    if opcode in XLA_COLLECTIVE_KINDS:
        return opcode, False
    if opcode.endswith("-start") and opcode[: -len("-start")] in XLA_COLLECTIVE_KINDS:
        return opcode[: -len("-start")], True
    return None
