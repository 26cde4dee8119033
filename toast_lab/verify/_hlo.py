"""Read what XLA compiled: collectives in HLO text, memory and cost analysis (DESIGN.md §9).

`parse_collectives` finds every collective in a module's text and says which mesh axes it runs
over and how many times it executes. XLA prints replica groups in three ways; this version
(jax 0.10.2) prints all three:

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

import dataclasses
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

COLLECTIVE_KINDS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
)

# Which size `Collective.bytes` reports: the whole buffer the collective works on, per device.
# all-gather's input is one shard of it, so it is priced by its result; the others by their input.
_PRICED_BY_RESULT = frozenset({"all-gather"})

# Bits per element of each HLO primitive type.
ELEMENT_BITS = {
    "pred": 8,
    "s2": 2,
    "s4": 4,
    "s8": 8,
    "s16": 16,
    "s32": 32,
    "s64": 64,
    "u2": 2,
    "u4": 4,
    "u8": 8,
    "u16": 16,
    "u32": 32,
    "u64": 64,
    "f16": 16,
    "bf16": 16,
    "f32": 32,
    "f64": 64,
    "c64": 64,
    "c128": 128,
    "f4e2m1fn": 4,
    "f8e3m4": 8,
    "f8e4m3": 8,
    "f8e4m3fn": 8,
    "f8e4m3fnuz": 8,
    "f8e4m3b11fnuz": 8,
    "f8e5m2": 8,
    "f8e5m2fnuz": 8,
    "f8e8m0fnu": 8,
    "token": 0,
}

# --- regexes, each with an example of what it reads ------------------------------------------

# HloModule jit_f, is_scheduled=true, entry_computation_layout={...}, num_partitions=8
_NUM_PARTITIONS = re.compile(r"^HloModule\b.*?\bnum_partitions=(\d+)", re.MULTILINE)
_REPLICA_COUNT = re.compile(r"^HloModule\b.*?\breplica_count=(\d+)", re.MULTILINE)

# %region_0.1_spmd (param: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
# ENTRY %main.0_spmd (param: f32[2,4]) -> f32[8,8] {
_COMPUTATION_HEADER = re.compile(
    r"^(?P<entry>ENTRY\s+)?%?(?P<name>[^\s(){}=]+)\s*(?:\(.*\)\s*->\s*.*)?\{\s*$"
)

#   ROOT %all-reduce.1 = f32[8,16]{1,0} all-reduce(%dot.1), channel_id=1, ...
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*(?P<rest>.*)$")

# all-reduce(        get-tuple-element(        collective-permute-start(
_OPCODE = re.compile(r"\s*(?P<opcode>[a-z][\w\-.]*)\(")

# (s32[], f32[8,8], /*index=5*/f32[5,16,8])
_COMMENT = re.compile(r"/\*.*?\*/")

# f32[8,16]{1,0}   bf16[<=128,4]   u32[]   f32[8]{0:S(1)}
_ARRAY_SHAPE = re.compile(r"\b(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\]")

# channel_id=3
_CHANNEL_ID = re.compile(r"\bchannel_id=(\d+)")

# use_global_device_ids=true
_USE_GLOBAL_DEVICE_IDS = re.compile(r"\buse_global_device_ids=(true|false)")

# dimensions={1}
_DIMENSIONS = re.compile(r"\bdimensions=\{(?P<dims>[\d,\s]*)\}")

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

# source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
_SOURCE_TARGET_PAIRS = re.compile(
    r"\bsource_target_pairs=\{(?P<body>(?:\s*\{\s*\d+\s*,\s*\d+\s*\}\s*,?)*)\s*\}"
)
_PAIR = re.compile(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}")

# body=%region_0.1_spmd    calls=%fused_computation    to_apply=%add.clone
_CALLED_COMPUTATION = re.compile(
    r"\b(?P<role>calls|to_apply|body|condition|true_computation|false_computation)"
    r"=%?(?P<name>[^\s,{}()]+)"
)
# branch_computations={%branch_0, %branch_1}    called_computations={%a, %b}
_CALLED_COMPUTATION_LIST = re.compile(
    r"\b(?:branch_computations|called_computations)=\{(?P<names>[^}]*)\}"
)

# backend_config={"known_trip_count":{"n":"5"}, ...}   (older: backend_config="{\"known...)
_KNOWN_TRIP_COUNT = re.compile(
    r'\\?"known_trip_count\\?"\s*:\s*\{\s*\\?"n\\?"\s*:\s*\\?"?(?P<n>\d+)'
)

# metadata={op_name="jit(loss)/transpose(jvp())/dot_general" stack_frame_id=3}
_OP_NAME = re.compile(r'\bop_name="(?P<op_name>(?:[^"\\]|\\.)*)"')

# Any double-quoted string, to blank out before reading attributes.
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


# --- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Collective:
    """One collective instruction of a compiled module, per device.

    kind: one of COLLECTIVE_KINDS (an async -start/-done pair is one collective, named by its
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


# --- the module's structure ------------------------------------------------------------------


@dataclass(frozen=True)
class _Instruction:
    name: str
    shape: str
    opcode: str
    operands: tuple[tuple[str, str | None], ...]  # (name, shape printed inline or None)
    attributes: str  # everything after the operands, quoted strings intact
    line: str


@dataclass(frozen=True)
class _Computation:
    name: str
    is_entry: bool
    instructions: tuple[_Instruction, ...]


@dataclass(frozen=True)
class _Module:
    computations: tuple[_Computation, ...]
    num_partitions: int | None
    replica_count: int | None


def _parse_module(text: str) -> _Module:
    computations = []
    current: tuple[str, bool] | None = None
    body: list[_Instruction] = []
    for raw in text.splitlines():
        line = _COMMENT.sub("", raw.rstrip())
        if current is None:
            if line[:1].isspace() or line.startswith("HloModule"):
                continue
            header = _COMPUTATION_HEADER.match(line)
            if header:
                current = (header["name"], bool(header["entry"]))
                body = []
            continue
        if line.startswith("}"):
            computations.append(_Computation(current[0], current[1], tuple(body)))
            current = None
            continue
        instruction = _parse_instruction(line)
        if instruction is not None:
            body.append(instruction)
    if current is not None:  # a snippet without its closing brace
        computations.append(_Computation(current[0], current[1], tuple(body)))
    partitions = _NUM_PARTITIONS.search(text)
    replicas = _REPLICA_COUNT.search(text)
    return _Module(
        tuple(computations),
        int(partitions.group(1)) if partitions else None,
        int(replicas.group(1)) if replicas else None,
    )


def _parse_instruction(line: str) -> _Instruction | None:
    match = _INSTRUCTION.match(line)
    if not match:
        return None
    rest = match["rest"].strip()
    shape, rest = _take_shape(rest)
    opcode = _OPCODE.match(rest)
    if shape is None or not opcode:
        return None
    operands_text, attributes = _take_parenthesized(rest, opcode.end() - 1)
    operands = tuple(_parse_operand(o) for o in _split_top_level(operands_text) if o.strip())
    return _Instruction(match["name"], shape, opcode["opcode"], operands, attributes, line)


def _take_shape(text: str) -> tuple[str | None, str]:
    """Split 'f32[8]{0} add(...)' or '(f32[8], s32[]) tuple(...)' into shape and the rest."""
    if text.startswith("("):
        shape, rest = _take_parenthesized(text, 0)
        return "(" + shape + ")", rest
    parts = text.split(None, 1)
    if len(parts) != 2:
        return None, text
    return parts[0], parts[1]


def _take_parenthesized(text: str, start: int) -> tuple[str, str]:
    """The text inside the parentheses opening at `start`, and what follows them."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], text[i + 1 :]
    return text[start + 1 :], ""


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside (), {} or []."""
    parts, depth, begin = [], 0, 0
    for i, char in enumerate(text):
        if char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[begin:i])
            begin = i + 1
    parts.append(text[begin:])
    return parts


def _parse_operand(text: str) -> tuple[str, str | None]:
    """'%dot.1' or 'f32[8,16]{1,0} %dot.1' (older printers) -> (name, inline shape)."""
    text = text.strip()
    if " " in text:
        shape, name = text.rsplit(None, 1)
        return name.lstrip("%"), shape
    return text.lstrip("%"), None


def _shape_bytes(shape: str, line: str = "") -> int:
    """Bytes of an array or tuple shape; dynamic dims count at their bound."""
    bits = 0
    for array in _ARRAY_SHAPE.finditer(shape):
        dtype = array["dtype"]
        if dtype not in ELEMENT_BITS:
            raise ValueError(
                f"Unknown HLO element type {dtype!r} in shape {shape!r}"
                + (f" of line:\n  {line.strip()}" if line else "")
                + f"\nKnown types: {', '.join(sorted(ELEMENT_BITS))}."
            )
        dims = [d.strip().lstrip("<=") for d in array["dims"].split(",") if d.strip()]
        count = math.prod(int(d) for d in dims if d.isdigit())
        bits += ELEMENT_BITS[dtype] * count
    return (bits + 7) // 8


def _shape_dtypes(shape: str) -> list[str]:
    return [m["dtype"] for m in _ARRAY_SHAPE.finditer(shape)]


# --- how often each computation runs ---------------------------------------------------------


def _computation_multipliers(module: _Module) -> dict[str, int]:
    """Executions per step of each computation: entry (or any uncalled computation) runs once;
    a while body runs its known trip count per execution of the while."""
    callers: dict[str, list[tuple[str, int]]] = defaultdict(list)
    names = {c.name for c in module.computations}
    for computation in module.computations:
        for instruction in computation.instructions:
            if instruction.opcode.endswith(("-update", "-done")):
                continue  # they name the async computation again; its start already did
            trip_count = _known_trip_count(instruction) if instruction.opcode == "while" else None
            attributes = _QUOTED.sub('""', instruction.attributes)
            called = [(m["role"], m["name"]) for m in _CALLED_COMPUTATION.finditer(attributes)]
            for listed in _CALLED_COMPUTATION_LIST.finditer(attributes):
                called += [("branch", n.strip().lstrip("%")) for n in listed["names"].split(",")]
            for role, callee in called:
                if callee in names:
                    factor = trip_count if (role == "body" and trip_count) else 1
                    callers[callee].append((computation.name, factor))

    memo: dict[str, int] = {}

    def multiplier(name: str, visiting: frozenset[str] = frozenset()) -> int:
        if name in memo:
            return memo[name]
        if name in visiting:  # a cycle cannot happen in valid HLO; do not loop forever
            return 1
        sites = callers.get(name)
        if not sites:
            result = 1
        else:
            result = sum(multiplier(c, visiting | {name}) * f for c, f in sites)
        memo[name] = result
        return result

    return {c.name: multiplier(c.name) for c in module.computations}


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


def _known_trip_count(instruction: _Instruction) -> int | None:
    match = _KNOWN_TRIP_COUNT.search(instruction.attributes)
    return int(match["n"]) if match else None


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


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


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


# --- mapping device groups to mesh axes ------------------------------------------------------


@dataclass(frozen=True)
class _MeshGrid:
    """The user's mesh: which (global) device id sits at which mesh coordinates."""

    axis_names: tuple[str, ...]
    shape: tuple[int, ...]
    coords: Mapping[int, tuple[int, ...]]

    @staticmethod
    def of(device_grid: Any, axis_names: Sequence[str]) -> _MeshGrid:
        grid = np.asarray(device_grid)
        names = tuple(axis_names)
        if grid.ndim != len(names):
            raise ValueError(
                f"device_grid has {grid.ndim} dimensions {grid.shape} but {len(names)} axis "
                f"names {names} were given; give one name per mesh dimension."
            )
        coords = {int(grid[index]): index for index in np.ndindex(grid.shape)}
        if len(coords) != grid.size:
            raise ValueError(f"device_grid repeats device ids:\n{grid}")
        return _MeshGrid(names, grid.shape, coords)

    def axes_of_groups(self, groups: Sequence[Sequence[int]]) -> tuple[str, ...]:
        """The mesh axes each group spans, if every group is a whole slice along the same axes."""
        spanned: set[int] | None = None
        for group in groups:
            if any(d not in self.coords for d in group) or len(set(group)) != len(group):
                return ()
            points = np.array([self.coords[d] for d in group])
            varying = {k for k in range(len(self.shape)) if len(set(points[:, k])) > 1}
            if spanned is None:
                spanned = varying
            if varying != spanned or len(group) != math.prod(self.shape[k] for k in varying):
                return ()
        return tuple(self.axis_names[k] for k in sorted(spanned or ()))

    def axes_of_pairs(self, pairs: Sequence[tuple[int, int]]) -> tuple[str, ...]:
        """The mesh axes along which a permutation moves data."""
        moved: set[int] = set()
        for source, target in pairs:
            if source not in self.coords or target not in self.coords:
                return ()
            moved |= {
                k
                for k, (a, b) in enumerate(zip(self.coords[source], self.coords[target]))
                if a != b
            }
        return tuple(self.axis_names[k] for k in sorted(moved))


# --- the parser ------------------------------------------------------------------------------


def _collective_kind(opcode: str) -> tuple[str, bool] | None:
    """(kind, is an async start) for a collective opcode; None for anything else (and -done)."""
    if opcode in COLLECTIVE_KINDS:
        return opcode, False
    if opcode.endswith("-start") and opcode[: -len("-start")] in COLLECTIVE_KINDS:
        return opcode[: -len("-start")], True
    return None


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
    if kind == "collective-permute":
        operands = operands[:1]  # in-place permutes also take an output buffer and offsets
    operand_shapes = []
    for name, inline in operands:
        shape = inline if inline is not None else shapes.get(name)
        if shape is None:
            raise ValueError(
                f"Operand %{name} of {kind} %{instruction.name} is not defined in computation "
                f"{computation!r}; cannot size it:\n  {line.strip()}"
            )
        operand_shapes.append(shape)

    attributes = _QUOTED.sub('""', instruction.attributes)
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


# --- compiled executables --------------------------------------------------------------------


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
