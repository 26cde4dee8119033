"""Read what XLA compiled: memory and cost analysis, and the collectives (DESIGN.md §9)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ._collectives import Collective, CollectiveTotal, summarize_collectives
from ._parse_collectives import parse_collectives


@dataclass(frozen=True)
class CompiledStats:
    """What XLA says about one compiled step, per device.

    argument_bytes / output_bytes / temp_bytes / alias_bytes / generated_code_bytes: from
        `compiled.memory_analysis()`, which reports one device's buffers (an SPMD executable is
        the same program on every device).
    flops / bytes_accessed: from `compiled.cost_analysis()`, of the partitioned (per-device)
        module.
    collectives: parsed from `compiled.as_text()`.
    """

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    generated_code_bytes: int
    flops: float
    bytes_accessed: float
    collectives: tuple[Collective, ...]

    @property
    def peak_bytes(self) -> int:
        """argument + output + temp - alias: the memory the step needs at once, per device.

        We compute it ourselves: memory_analysis()'s own peak field is unreliable on CPU.
        """
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

    def collective_summary(self) -> dict[tuple[str, tuple[str, ...]], CollectiveTotal]:
        return summarize_collectives(self.collectives)

    def __repr__(self) -> str:
        return (
            f"CompiledStats(peak_bytes={self.peak_bytes}, argument_bytes={self.argument_bytes}, "
            f"output_bytes={self.output_bytes}, temp_bytes={self.temp_bytes}, "
            f"alias_bytes={self.alias_bytes}, flops={self.flops:g}, "
            f"bytes_accessed={self.bytes_accessed:g}, collectives={len(self.collectives)})"
        )


def read_compiled(compiled: Any, mesh: Any) -> CompiledStats:
    """Memory, cost and collectives of a `jax.jit(...).lower(...).compile()` result.

    mesh: the `jax.sharding.Mesh` it was compiled for (its axis names and device order map
        XLA's device ids to mesh axes); a toast_lab `Mesh` also works, taking devices in
        row-major order.
    """
    axis_names, grid = _device_grid(compiled, mesh)
    memory = compiled.memory_analysis()
    if memory is None:
        raise ValueError(
            "compiled.memory_analysis() returned None: this backend does not report memory. "
            "Compile on CPU (simulated devices), GPU or TPU."
        )
    cost = _cost_dict(compiled.cost_analysis())
    return CompiledStats(
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        generated_code_bytes=int(memory.generated_code_size_in_bytes),
        flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        collectives=parse_collectives(compiled.as_text(), grid, axis_names),
    )


def _cost_dict(cost: Any) -> dict[str, float]:
    """cost_analysis() is a dict in jax 0.10; older versions return a list of per-module dicts."""
    if cost is None:
        return {}
    if isinstance(cost, Mapping):
        return dict(cost)
    total: dict[str, float] = defaultdict(float)
    for part in cost:
        for key, value in (part or {}).items():
            total[key] += value
    return dict(total)


def _device_grid(compiled: Any, mesh: Any) -> tuple[tuple[str, ...], np.ndarray]:
    """Axis names, and the HLO device id (position in the executable's device assignment) at
    each mesh position."""
    axis_names = tuple(mesh.axis_names)
    devices = getattr(mesh, "devices", None)
    if not isinstance(devices, np.ndarray):  # a toast_lab Mesh: row-major device ids
        sizes = tuple(mesh.shape[name] for name in axis_names)
        return axis_names, np.arange(math.prod(sizes)).reshape(sizes)
    try:
        assignment = list(compiled.runtime_executable().local_devices())
    except Exception:  # no runtime executable (e.g. deserialized): assume mesh order
        assignment = []
    position = {device.id: i for i, device in enumerate(assignment)}
    if len(assignment) == devices.size and all(d.id in position for d in devices.flat):
        ids = [position[d.id] for d in devices.flat]
    else:
        ids = list(range(devices.size))
    return axis_names, np.array(ids).reshape(devices.shape)
