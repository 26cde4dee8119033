"""The analysis's result types: sharding-equivalence classes and conflicts (frozen)."""

from __future__ import annotations

from dataclasses import dataclass, replace

REPLICATE = "replicate"  # the conflict resolution that shards neither side
NO_CLASS = -1  # sentinel in Analysis.value_classes: a dim of size 1, never sharded
# A class is minor when its bytes at stake are under this share of the largest class's: what
# sharding it could save or cost is noise beside the decisions that matter, so a decision list
# shows such classes under one "minor" entry rather than one by one.
MINOR_SHARE = 0.01


def unique_name(name: str, taken: set[str]) -> str:
    """`name`, or `name_1`, `name_2`, ... — the first not in `taken` (which it joins)."""
    out, k = name, 1
    while out in taken:
        out = f"{name}_{k}"
        k += 1
    taken.add(out)
    return out


@dataclass(frozen=True)
class DimClass:
    """Tensor dims that must be sharded alike (or pay a reshard somewhere).

    members: (value id, dim) pairs, in program order. compound_members: how many reshape-made
    compound dims have a factor in this class. bytes: total bytes of the values it touches (what
    is at stake when deciding it). layers: how many repeated layers it covers when grouped.
    origin: where it first appears (an argument path and dim, or an op). formerly: the names
    older toast-labs gave it, newest first, still accepted by `Analysis.class_named` (none
    where the same). minor: its bytes are under `MINOR_SHARE` of the largest class's.
    """

    id: int
    name: str
    size: int
    members: tuple[tuple[int, int], ...]
    bytes: int
    num_values: int
    aliases: tuple[str, ...] = ()
    layers: int = 1
    origin: str = ""
    compound_members: int = 0
    formerly: tuple[str, ...] = ()
    minor: bool = False

    def __repr__(self) -> str:
        also = f" aka {'/'.join(self.aliases)}" if self.aliases else ""
        layers = f" x{self.layers} layers" if self.layers > 1 else ""
        minor = ", minor" if self.minor else ""
        return (f"DimClass(#{self.id} {self.name!r}{also} size={self.size}, "
                f"{len(self.members)} dims in {self.num_values} values, "
                f"{self.bytes / 2**20:.1f} MiB{layers}{minor})")


@dataclass(frozen=True)
class ConflictSide:
    """One occurrence of the class on the conflicted values: the dims that travel together.

    label: 'dim2' — named after the dim it holds on the conflict's site value.
    """

    label: str
    site_dim: int
    members: tuple[tuple[int, int], ...]

    @property
    def resolution(self) -> str:
        return f"keep_{self.label}"


@dataclass(frozen=True)
class Conflict:
    """A class landing on two dims of one value (attention logits [b, h, q, k]: q and k).

    site: the op that first makes such a value (NO_OP when it is an argument); site_value: that
    value. values: every value with two dims in the class, in this conflict. sides: the
    occurrences; keeping one side sharded means gathering the others where they meet. Empty
    when only replicating the class on these values resolves it (three dims, or a dim that
    meets itself).
    """

    id: int
    class_id: int
    class_name: str
    site: int
    site_value: int
    where: str
    source: str
    primitive: str
    values: tuple[int, ...]
    sides: tuple[ConflictSide, ...]
    layers: int = 1
    name: str = ""  # unique in the analysis: "<class>@<where>", the key plan files use

    @property
    def resolutions(self) -> tuple[str, ...]:
        """Choices for a plan: keep one side sharded, or replicate the class at the conflict."""
        return tuple(s.resolution for s in self.sides) + (REPLICATE,)

    def with_id(self, i: int, name: str) -> "Conflict":
        return replace(self, id=i, name=name)

    def merged(self, other: "Conflict") -> "Conflict":
        """The same conflict in another layer: one decision covers both."""
        sides = tuple(replace(a, members=a.members + b.members)
                      for a, b in zip(self.sides, other.sides))
        return replace(self, values=self.values + other.values, sides=sides,
                       layers=self.layers + other.layers)

    def __repr__(self) -> str:
        layers = f" x{self.layers} layers" if self.layers > 1 else ""
        return (f"Conflict(#{self.id} {self.class_name!r} at {self.where} ({self.source}): "
                f"{len(self.values)} values{layers}; resolutions {list(self.resolutions)})")
