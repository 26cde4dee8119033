"""The device mesh: named axes over devices of one kind (DESIGN.md §4).

Devices are laid out row-major over the axes, like `jax.make_mesh`: the last axis varies
fastest over device ids. An axis whose devices all sit within one node (its stride times its
size is at most the device's `devices_per_node`) talks over the fast intra-node link; any other
axis crosses nodes and is priced at the inter-node link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np

from ._hardware import DeviceSpec, Link, get_device

_TOO_FEW_DEVICES = """\
{mesh!r} needs {need} devices but JAX sees {have} ({platform}).
To simulate {need} devices on the CPU, do one of these before JAX initializes its backends \
(before the first jax.devices() or computation):
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count={need}"  # before import jax
    jax.config.update("jax_num_cpu_devices", {need})
or pass `devices=` with at least {need} devices."""


@dataclass(frozen=True, init=False)
class Mesh:
    """Named mesh axes over devices of one kind.

    Mesh({"data": 4, "model": 2}, device="h100")

    axes: ordered ((name, size), ...), major to minor.
    device: the DeviceSpec of every device (a preset name is looked up with `get_device`).
    links: per-axis Link overrides; other axes get the device's intra- or inter-node link.
    """

    axes: tuple[tuple[str, int], ...]
    device: DeviceSpec
    links: Mapping[str, Link]

    def __init__(
        self,
        axes: Mapping[str, int] | Iterable[tuple[str, int]],
        device: str | DeviceSpec = "cpu",
        links: Mapping[str, Link] | None = None,
    ) -> None:
        pairs = _axis_pairs(axes)
        spec = get_device(device)
        overrides = dict(links or {})
        names = [name for name, _ in pairs]
        for name, link in overrides.items():
            if name not in names:
                raise ValueError(
                    f"links names axis {name!r}, which is not in the mesh axes {tuple(names)}."
                )
            if not isinstance(link, Link):
                raise TypeError(
                    f"links[{name!r}] must be a toast_lab Link(bandwidth, latency), got {link!r}."
                )
        object.__setattr__(self, "axes", pairs)
        object.__setattr__(self, "device", spec)
        object.__setattr__(self, "links", MappingProxyType(overrides))

    # --- shape ---------------------------------------------------------------------------

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def shape(self) -> dict[str, int]:
        """Axis name -> size, in mesh order (a fresh dict)."""
        return dict(self.axes)

    @property
    def size(self) -> int:
        """Number of devices."""
        return math.prod(size for _, size in self.axes)

    def axis_size(self, name: str) -> int:
        return self.axes[self._index(name)][1]

    def axis_stride(self, name: str) -> int:
        """Distance in device ids between neighbours along the axis (row-major layout)."""
        index = self._index(name)
        return math.prod(size for _, size in self.axes[index + 1 :])

    def link(self, name: str) -> Link:
        """The link that a collective along this axis runs over."""
        index = self._index(name)
        if name in self.links:
            return self.links[name]
        if self.axis_stride(name) * self.axes[index][1] <= self.device.devices_per_node:
            return self.device.intra_node
        return self.device.inter_node

    def _index(self, name: str) -> int:
        for i, (axis, _) in enumerate(self.axes):
            if axis == name:
                return i
        raise KeyError(f"{self!r} has no axis {name!r}; its axes are {self.axis_names}.")

    # --- JAX ------------------------------------------------------------------------------

    @classmethod
    def from_jax(cls, jax_mesh: jax.sharding.Mesh, device: str | DeviceSpec = "cpu") -> Mesh:
        """The Mesh with a `jax.sharding.Mesh`'s axis names and sizes."""
        return cls(tuple(zip(jax_mesh.axis_names, jax_mesh.devices.shape)), device=device)

    def jax_mesh(self, devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
        """A `jax.sharding.Mesh` of this shape on the first `size` devices, with Auto axes.

        Auto axes (jax 0.10 defaults to Explicit) so that `with_sharding_constraint` and
        GSPMD-style propagation apply, as our plans expect.
        """
        available = list(jax.devices() if devices is None else devices)
        if len(available) < self.size:
            platform = available[0].platform if available else "no devices"
            raise ValueError(
                _TOO_FEW_DEVICES.format(
                    mesh=self, need=self.size, have=len(available), platform=platform
                )
            )
        n = len(self.axes)
        return jax.make_mesh(
            tuple(size for _, size in self.axes),
            self.axis_names,
            axis_types=(jax.sharding.AxisType.Auto,) * n,
            devices=available[: self.size],
        )

    # --- dunder ---------------------------------------------------------------------------

    def __hash__(self) -> int:
        return hash((self.axes, self.device, tuple(sorted(self.links.items()))))

    def __reduce__(self):
        # A mappingproxy cannot be pickled; rebuild from a plain dict instead.
        return (Mesh, (self.axes, self.device, dict(self.links)))

    def __repr__(self) -> str:
        shape = ", ".join(f"{name}={size}" for name, size in self.axes)
        links = f", links={dict(self.links)!r}" if self.links else ""
        return f"Mesh({shape}, device={self.device.name!r}{links})"


def check_mesh(mesh: Any, caller: str | None = None) -> Mesh:
    """`mesh` when it is a toast_lab Mesh; otherwise a TypeError that says what to pass, and how
    to make one from what was given (a `jax.sharding.Mesh`, a dict of axis sizes). `caller`
    (e.g. "tl.search") starts the message when given. The one check every entry point that
    takes a mesh makes (Plan.validate, and through it tl.estimate and tl.verify)."""
    if isinstance(mesh, Mesh):
        return mesh
    if isinstance(mesh, jax.sharding.Mesh) or hasattr(mesh, "devices"):
        fix = " (a jax mesh: tl.Mesh.from_jax(jax_mesh, device=...))"
    elif isinstance(mesh, Mapping):
        fix = f" (axis sizes: tl.Mesh({_short_repr(dict(mesh))}, device=...))"
    else:
        fix = ""
    where = f"{caller}: " if caller else ""
    given = ("jax.sharding.Mesh" if isinstance(mesh, jax.sharding.Mesh)
             else type(mesh).__name__)
    raise TypeError(f"{where}expected a toast_lab Mesh, e.g. tl.Mesh({{'data': 4, 'model': 2}}, "
                    f"device='h100'), got {given}{fix}")


def _short_repr(x: Any, limit: int = 60) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _axis_pairs(axes: Any) -> tuple[tuple[str, int], ...]:
    """Validate mesh axes given as a mapping or as (name, size) pairs."""
    if isinstance(axes, Mapping):
        items = list(axes.items())
    else:
        try:
            items = [tuple(pair) for pair in axes]
        except TypeError:
            raise TypeError(
                f"Mesh axes must be a mapping like {{'data': 4, 'model': 2}} or (name, size) "
                f"pairs, got {axes!r}."
            ) from None
        if any(len(pair) != 2 for pair in items):
            raise TypeError(f"Mesh axes must be (name, size) pairs, got {axes!r}.")
    if not items:
        raise ValueError("A Mesh needs at least one axis, e.g. Mesh({'data': 8}).")
    seen: set[str] = set()
    pairs = []
    for name, size in items:
        if not isinstance(name, str) or not name:
            raise TypeError(f"Mesh axis names must be non-empty strings, got {name!r}.")
        if name in seen:
            raise ValueError(f"Mesh axis {name!r} appears twice in {items}.")
        seen.add(name)
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"Mesh axis {name!r} must have a positive integer size, got {size!r}.")
        pairs.append((name, int(size)))
    return tuple(pairs)
