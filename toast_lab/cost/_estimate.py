"""Estimate: what the cost model says a plan costs, per device (frozen, printable)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..plan import format_bytes

# collective-permute: point to point: a shard_map body's ppermute (_manual.py), and the
# reshards XLA's partitioner writes as one (a dim handed to other axes, a matmul's reduced
# shard moved into place, a scatter's indices regrouped, a re-tiled batched gather's labels
# and picks, a dim's axes put back in the plan's order: _kernel.py)
COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                    "collective-permute")


@dataclass(frozen=True)
class CollectiveCost:
    """One kind of collective over one set of mesh axes: how often, how many bytes, how long."""

    count: float
    bytes: float   # per device, by the convention of verify: all-gather counts its output,
                   # a collective-permute what each device sends (its operand)
    time_s: float


@dataclass(frozen=True)
class Estimate:
    """Per-device step time (seconds) and memory (bytes) of one plan on one mesh.

    step_time_s = compute_s + exposed_communication_s. `overlap` says how the two combine:
    "scheduled" (default) overlaps collectives with independent compute the way XLA's
    scheduler runs them, and exposed_communication_s is what stays on the critical path;
    "none" adds all communication, "perfect" takes max(compute, communication).
    communication_s: every collective's time, hidden or not; communication_by_axis: that time
    by mesh axis ({axis name: seconds}; a collective over several axes is split by the time
    each level of the network takes). peak_memory_bytes = argument + output + temporaries −
    aliased (donated) bytes, the way XLA's memory_analysis() adds them up. feasible: the peak
    fits the device's memory. collectives: {(kind, mesh axes): CollectiveCost}, kind one of
    COLLECTIVE_KINDS.
    memory_breakdown: bytes by category at the peak, adding up to it (none negative: outputs
    in donated buffers are not counted again). by_scope: {top-level name scope:
    (compute_s, communication_s)}.
    """

    step_time_s: float
    compute_s: float
    communication_s: float
    flops: float
    peak_memory_bytes: float
    argument_bytes: float
    output_bytes: float
    temp_bytes: float
    alias_bytes: float
    memory_capacity_bytes: float
    collectives: dict = field(default_factory=dict)
    memory_breakdown: dict = field(default_factory=dict)
    by_scope: dict = field(default_factory=dict)
    overlap: str = "scheduled"
    device: str = ""
    exposed_communication_s: float = 0.0
    communication_by_axis: dict = field(default_factory=dict)
    # flops with each loop body counted once, the way XLA's cost_analysis() counts a while
    # loop (flops counts every iteration: what runs)
    flops_loop_bodies_once: float = 0.0

    @property
    def feasible(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    @property
    def collective_bytes(self) -> dict:
        """{(kind, axes): bytes}, comparable with verify's measured collective summary."""
        return {k: c.bytes for k, c in self.collectives.items()}

    @property
    def breakdown(self) -> dict:
        """Step time by part: compute and each collective kind (seconds)."""
        out = {"compute": self.compute_s}
        for (kind, _), c in self.collectives.items():
            out[kind] = out.get(kind, 0.0) + c.time_s
        return out

    def summary(self) -> str:
        mib = format_bytes
        axes = ", ".join(f"{a} {t * 1e3:.3f}" for a, t in self.communication_by_axis.items())
        lines = [
            f"step time      {self.step_time_s * 1e3:10.3f} ms  (compute {self.compute_s * 1e3:.3f}"
            f" ms, exposed communication {self.exposed_communication_s * 1e3:.3f} ms; "
            f"overlap {self.overlap})",
            f"communication  {self.communication_s * 1e3:10.3f} ms"
            + (f"  (by axis, ms: {axes})" if axes else ""),
            f"flops/device   {self.flops:10.3e}",
            f"peak memory    {mib(self.peak_memory_bytes):>14}  of "
            f"{mib(self.memory_capacity_bytes)} on {self.device}: "
            f"{'fits' if self.feasible else 'DOES NOT FIT'}",
            f"  arguments {mib(self.argument_bytes)}, outputs {mib(self.output_bytes)}, "
            f"temporaries {mib(self.temp_bytes)}, aliased {mib(self.alias_bytes)}",
        ]
        if self.collectives:
            lines.append("collectives (per device per step):")
            for (kind, axes), c in sorted(self.collectives.items(), key=lambda kv: -kv[1].time_s):
                lines.append(f"  {kind:<15} {'x'.join(axes) or '-':<14} {c.count:8.0f} x  "
                             f"{mib(c.bytes):>14}  {c.time_s * 1e3:9.3f} ms")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return (f"Estimate(step={self.step_time_s * 1e3:.3f} ms, "
                f"peak={format_bytes(self.peak_memory_bytes)}, "
                f"{'feasible' if self.feasible else 'infeasible'})")

    def to_dict(self) -> dict:
        """JSON-ready numbers (plan files keep them for the JupyterLab viewer)."""
        return {
            "step_time_s": self.step_time_s, "compute_s": self.compute_s,
            "communication_s": self.communication_s,
            "exposed_communication_s": self.exposed_communication_s,
            "communication_by_axis": dict(self.communication_by_axis), "flops": self.flops,
            "peak_memory_bytes": self.peak_memory_bytes, "argument_bytes": self.argument_bytes,
            "output_bytes": self.output_bytes, "temp_bytes": self.temp_bytes,
            "alias_bytes": self.alias_bytes, "memory_capacity_bytes": self.memory_capacity_bytes,
            "feasible": self.feasible, "overlap": self.overlap, "device": self.device,
            "collectives": [{"kind": k, "axes": list(a), "count": c.count, "bytes": c.bytes,
                             "time_s": c.time_s} for (k, a), c in self.collectives.items()],
            "memory_breakdown": dict(self.memory_breakdown),
        }


def top_scope(op) -> str:
    """The key of Estimate.by_scope an op counts in: its top-level name scope, "(top)" outside
    any."""
    return op.name_scope.split("/")[0] or "(top)"


def scope_index(names) -> tuple[np.ndarray, list[str]]:
    """([N] the index of each of `names` among the distinct ones, the distinct ones in order
    of first appearance)."""
    scopes: dict[str, int] = {}
    index = [scopes.setdefault(name, len(scopes)) for name in names]
    return np.array(index, np.int64), list(scopes)
