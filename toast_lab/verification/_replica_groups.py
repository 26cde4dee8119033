"""Replica groups as XLA prints them, expanded to groups of global device ids (DESIGN.md §9).

XLA prints replica groups in three ways; this version (jax 0.10.2) prints all three:

    replica_groups={{0,2,4,6},{1,3,5,7}}                    explicit list (e.g. shard_map)
    replica_groups=[2,4]<=[4,2]T(1,0)                       iota(8) as [4,2], transposed, as [2,4]
    replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}   mesh axes (automatic partitioning)

The mesh form may carry a device order (`mesh[...], device_ids=([4,2]T(1,0)) {...}`) and
sub-axes (`{'axis_0':(1)2}`). Its mesh is XLA's own (names like 'axis_0', sometimes with extra
size-1 axes), not the user's, so every form is first expanded to groups of device ids and those
are then matched against the user's mesh.

Device ids. A group lists replica ids, partition ids or global ("flattened") ids depending on
`channel_id` and `use_global_device_ids`, as in XLA's `GetCollectiveOpGroupMode`:

    no channel_id                              -> replica ids      (cross-replica)
    channel_id, no use_global_device_ids       -> partition ids    (all-to-all, collective-permute)
    channel_id, use_global_device_ids=false    -> replica ids, each group spanning all partitions
    channel_id, use_global_device_ids=true     -> global ids = replica * num_partitions + partition

When the module header states `num_partitions` / `replica_count` we follow these rules exactly.
Without a header (hand-written snippets) we take every id as a global device id: with one
program per device (jit SPMD: 1 replica, N partitions; pmap: N replicas, 1 partition) replica
ids, partition ids and global ids coincide. Global ids index the executable's device
assignment, which for `jax.jit` over a mesh is the mesh's devices in row-major order; the
`device_grid` argument says which id sits at each mesh position.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ._hlo_text import _ints

# --- regexes, each with an example of what it reads ------------------------------------------

# channel_id=3
_CHANNEL_ID = re.compile(r"\bchannel_id=(\d+)")

# use_global_device_ids=true
_USE_GLOBAL_DEVICE_IDS = re.compile(r"\buse_global_device_ids=(true|false)")

# replica_groups={{0,1},{2,3}}      replica_groups={}
_LIST_GROUPS = re.compile(r"\breplica_groups=\{(?P<body>(?:\s*\{[\d,\s]*\}\s*,?)*)\s*\}")
_LIST_GROUP = re.compile(r"\{([\d,\s]*)\}")

# replica_groups=[2,4]<=[4,2]T(1,0)      replica_groups=[4,2]<=[8]
_IOTA_GROUPS = re.compile(
    r"\breplica_groups=\[(?P<shape>[\d,]+)\]<=\[(?P<dims>[\d,]+)\](?:T\((?P<perm>[\d,]+)\))?"
)

# replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}
# replica_groups=mesh['axis_0'=1,'axis_1'=2,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_1'}
# replica_groups=mesh['a'=8] {'a':(2)4}
_MESH_GROUPS = re.compile(
    r"\breplica_groups=mesh\[(?P<axes>[^\]]*)\]"
    r"(?:\s*,\s*device_ids=\((?P<ids>[^()]*(?:\([^()]*\))?)\))?"
    r"\s*\{(?P<refs>[^}]*)\}"
)
# 'axis_0'=4     axis_0=4
_MESH_AXIS = re.compile(r"(?:'(?P<quoted>[^']*)'|(?P<bare>[^\s,=']+))=(?P<size>\d+)")
# 'axis_0'     'axis_0':(1)2     axis_0
_MESH_AXIS_REF = re.compile(
    r"^\s*(?:'(?P<quoted>[^']*)'|(?P<bare>[^\s:']+))(?::\((?P<pre>\d+)\)(?P<size>\d+))?\s*$"
)
# replica_groups=maximal_mesh[device_id=3] {}
_MAXIMAL_MESH_GROUPS = re.compile(r"\breplica_groups=maximal_mesh\[device_id=(?P<id>\d+)\]")
# [4,2]T(1,0)     [8]
_IOTA_IDS = re.compile(r"^\[(?P<dims>[\d,]+)\](?:T\((?P<perm>[\d,]+)\))?$")


# --- replica groups --------------------------------------------------------------------------


def _written_groups(attributes: str, line: str) -> list[list[int]] | None:
    """The groups as printed, in whichever syntax; None for `{}` or no groups (= everyone)."""
    listed = _LIST_GROUPS.search(attributes)
    if listed:
        groups = [
            [int(i) for i in g.split(",") if i.strip()]
            for g in _LIST_GROUP.findall(listed["body"])
        ]
        return groups or None
    iota = _IOTA_GROUPS.search(attributes)
    if iota:
        shape = _ints(iota["shape"])
        ids = _iota_ids(_ints(iota["dims"]), _ints(iota["perm"]) if iota["perm"] else None)
        if len(shape) != 2 or math.prod(shape) != ids.size:
            raise ValueError(f"Cannot read iota replica groups {iota.group(0)!r} in:\n  {line}")
        return ids.reshape(shape).tolist()
    mesh = _MESH_GROUPS.search(attributes)
    if mesh:
        return _mesh_axes_groups(mesh, line)
    maximal = _MAXIMAL_MESH_GROUPS.search(attributes)
    if maximal:
        return [[int(maximal["id"])]]
    if "replica_groups=" in attributes:
        raise ValueError(
            f"Cannot read the replica_groups of this instruction (not an explicit list, an iota "
            f"list or mesh axes):\n  {line.strip()}"
        )
    return None


def _iota_ids(dims: Sequence[int], perm: Sequence[int] | None) -> np.ndarray:
    """iota(prod(dims)) reshaped to `dims` and transposed by `perm`, flattened."""
    ids = np.arange(math.prod(dims)).reshape(dims)
    if perm is not None:
        ids = ids.transpose(perm)
    return ids.reshape(-1)


def _mesh_axes_groups(match: re.Match, line: str) -> list[list[int]]:
    """Expand XLA's MeshAxesReplicaGroupList: one group per combination of the axes not named,
    holding the devices along the named (sub-)axes, as in replica_group.cc."""
    axes = [(m["quoted"] if m["quoted"] is not None else m["bare"], int(m["size"]))
            for m in _MESH_AXIS.finditer(match["axes"])]
    names = [name for name, _ in axes]
    shape = [size for _, size in axes]
    if not axes:
        raise ValueError(f"Cannot read the mesh of these replica groups:\n  {line.strip()}")
    ids_text = (match["ids"] or "").strip()
    if not ids_text:
        ids = np.arange(math.prod(shape))
    elif iota := _IOTA_IDS.match(ids_text):
        ids = _iota_ids(_ints(iota["dims"]), _ints(iota["perm"]) if iota["perm"] else None)
    else:
        ids = np.array(_ints(ids_text))
    if ids.size != math.prod(shape):
        raise ValueError(
            f"The device_ids of mesh {match['axes']!r} hold {ids.size} devices, not "
            f"{math.prod(shape)}:\n  {line.strip()}"
        )
    ids = ids.reshape(shape)

    refs = []  # (mesh dim, pre-size or None, size or None)
    for text in match["refs"].split(","):
        if not text.strip():
            continue
        ref = _MESH_AXIS_REF.match(text)
        name = ref and (ref["quoted"] if ref["quoted"] is not None else ref["bare"])
        if not ref or name not in names:
            raise ValueError(
                f"Replica groups name mesh axis {name or text.strip()!r}, which is not one of "
                f"{names}:\n  {line.strip()}"
            )
        pre = int(ref["pre"]) if ref["pre"] else None
        refs.append((names.index(name), pre, int(ref["size"]) if ref["size"] else None))

    # Split each mesh dim into the factors its (sub-)axes name, major to minor; remember which
    # factor each reference gathers over.
    factors: list[int] = []
    gathered: list[int] = [0] * len(refs)
    for dim, size in enumerate(shape):
        on_dim = [(i, r) for i, r in enumerate(refs) if r[0] == dim]
        if not on_dim:
            factors.append(size)
            continue
        if len(on_dim) == 1 and on_dim[0][1][1] is None:  # the whole axis
            gathered[on_dim[0][0]] = len(factors)
            factors.append(size)
            continue
        covered = 1
        for i, (_, pre, sub_size) in sorted(on_dim, key=lambda t: t[1][1] or 1):
            if pre is None or sub_size is None:
                raise ValueError(f"Mesh axis used whole and as sub-axes at once:\n  {line}")
            if pre != covered:
                factors.append(pre // covered)
                covered = pre
            gathered[i] = len(factors)
            factors.append(sub_size)
            covered *= sub_size
        if covered != size:
            factors.append(size // covered)
    kept = [k for k in range(len(factors)) if k not in gathered]
    group_size = math.prod(factors[k] for k in gathered)
    return ids.reshape(factors).transpose(kept + gathered).reshape(-1, group_size).tolist()


@dataclass(frozen=True)
class _IdSpace:
    """How a module numbers devices: replica and partition counts from its header."""

    replicas: int | None
    partitions: int | None
    everyone: tuple[int, ...]  # the grid's ids, for `{}` in a snippet without a header

    def groups(self, written: list[list[int]] | None, mode: str) -> list[list[int]]:
        """Groups of replica / partition / global ids -> groups of global device ids."""
        if self.replicas is None and self.partitions is None:
            # No module header: take ids as global ids (see the module docstring).
            return written if written is not None else [list(self.everyone)]
        r, p = self.replicas or 1, self.partitions or 1
        if mode == "flattened":
            return written if written is not None else [list(range(r * p))]
        if mode == "cross-replica":
            groups = written if written is not None else [list(range(r))]
            return [[rep * p + part for rep in g] for part in range(p) for g in groups]
        if mode == "cross-partition":
            groups = written if written is not None else [list(range(p))]
            return [[rep * p + part for part in g] for rep in range(r) for g in groups]
        # cross-replica-and-partition: replica groups, each over all partitions
        groups = written if written is not None else [list(range(r))]
        return [[rep * p + part for rep in g for part in range(p)] for g in groups]

    def pairs(self, written: list[tuple[int, int]], mode: str) -> list[tuple[int, int]]:
        """(source, target) replica or partition ids -> global device ids."""
        if self.replicas is None and self.partitions is None:
            return written
        r, p = self.replicas or 1, self.partitions or 1
        if mode == "cross-replica":
            return [(a * p + part, b * p + part) for part in range(p) for a, b in written]
        return [(rep * p + a, rep * p + b) for rep in range(r) for a, b in written]


def _group_mode(attributes: str, kind: str) -> str:
    """XLA's CollectiveOpGroupMode, from channel_id and use_global_device_ids."""
    if not _CHANNEL_ID.search(attributes):
        return "cross-replica"
    if kind in ("all-to-all", "collective-permute", "collective-broadcast"):
        return "cross-partition"  # these ops have no use_global_device_ids
    flag = _USE_GLOBAL_DEVICE_IDS.search(attributes)
    if flag and flag.group(1) == "true":
        return "flattened"
    return "cross-replica-and-partition"
