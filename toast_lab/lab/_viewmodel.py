"""The Lab's view model: a frozen, JSON-ready description of what to draw for one state of a
session (treescope's intermediate form). Python builds it (`_build.py`); the TypeScript view only
draws it, in the live widget and in the kernel-less plan viewer alike.

The types mirror labextension/src/viewmodel.ts field for field (snake_case on both sides);
sequences are tuples here and arrays in JSON. `ViewModel.to_dict()` is what the widget's `view`
traitlet and a plan file's "view" carry (`saved_view` drops the moment's state for a file);
`ViewModel.from_dict` reads it back (a round trip gives an equal model); `to_text()` renders it
for tests and terminals. Fields beyond the first version's have defaults, so plan files without
them still read.

The widget (`_widget.LabView`, labextension/src/widget.ts) carries the model whole in `view`,
replaced on every change, beside `op_costs` (per-op seconds as a binary buffer) and `progress`.
The front end answers with events (`LabEvent` in viewmodel.ts), each an ipywidgets custom
message ``{"event": name, ...}``; `Lab._on_event` acts on it and sends a new `view` (a refused
event shows as the view's `error`):

- ``pin {name, value}``: fix a class to mesh axes (a list; [] replicated), a conflict to a
  resolution (a string), "remat@<group>" to a remat policy (a string), "micro_batches" to
  a count (an integer) or "pipeline@<stack>" to stages ("stage:2", "none"): a choice in the
  Decisions tab, or a collective's remedy;
- ``unpin {name}``: release a pinned decision (it keeps its value until a search changes it);
- ``toggle {group}``: open a collapsed scope group, or close an open one (a click on a group);
- ``select {kind, id}``: an op (id: its op id) or a drawn edge (id: the edge's); the view then
  carries its collectives `explained`, and an op's `details` (Python also takes group, class
  and conflict);
- ``search {budget_s}``: MCTS over what is not pinned, in the background;
- ``stop {}``: end the search, keeping the best plan found;
- ``export {path}``: write the plan file (default "plan.json") with this view model in it.

The plan viewer has no kernel: it sends none of them, and opens groups itself.
"""

from __future__ import annotations

import collections.abc
import json
import types
import typing
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Mapping

FORMAT = "toast-lab-view"
VERSION = 1


@dataclass(frozen=True)
class ChoiceView:
    """One option of a decision, priced from the current plan (the counterfactual).

    value: mesh axes for a class, a resolution for a conflict. valid/reason: whether it can be
    chosen and why not. note: what else happens when chosen (an axis another class already
    holds on shared tensors stays with the class decided first). step_time_s /
    peak_memory_bytes: the plan with this choice (None when not priced: refused, or during a
    search).
    """

    label: str
    value: tuple[str, ...] | str | int
    current: bool
    valid: bool
    reason: str | None
    step_time_s: float | None
    peak_memory_bytes: float | None
    note: str | None = None


@dataclass(frozen=True)
class StepDecisionView:
    """A decision beyond sharding (_step_choices.py) and its choices, priced like a class's.

    name: what to pin ("remat@block", "micro_batches"); label: in words ("remat: block
    (scanned ×4)", "micro-batches"); value: the plan's (a remat policy, or a micro-batch
    count); choices: each policy or count, its note saying what it keeps or how the batch
    splits, a count whose micro-batches do not divide over the batch's devices refused."""

    name: str
    label: str
    value: str | int
    pinned: bool
    choices: tuple[ChoiceView, ...]


@dataclass(frozen=True)
class ScheduleView:
    """A pipelined plan's schedule (_schedule.py): which micro-batch each stage runs at each
    tick of the step's two loops, the bubble, and the hand-offs between stages.

    name: the decision ("pipeline@block"); group: the scanned stack; scope: the scope-tree
    group the graph draws it as (None where no one group holds its layers); axis / stages /
    layers: S stages over mesh axis `axis`; schedule: "gpipe" or "circular"; chunks: V, the
    runs of layers each stage holds (1 for GPipe; stage s's run r holds layer chunk r S + s
    of the stack's S V, layers // (S V) layers each); micro_batches: M; ticks: T = V M + S - 1
    per loop; forward / backward: [S][T], the work item stage s runs at tick t of each loop,
    r M + m for micro-batch m in its run r (m itself for GPipe), -1 where it idles (the
    bubble); bubble: the idle share of each stage's ticks, (S - 1) / T; handoff_bytes /
    handoff_s: one hand-off (a collective-permute over `axis`, per device), the estimate's
    bytes and seconds over its count; handoffs: that count per step (one per tick, both
    loops); None where no estimate prices them (no mesh)."""

    name: str
    group: str
    scope: str | None
    axis: str
    stages: int
    layers: int
    micro_batches: int
    schedule: str
    ticks: int
    bubble: float
    forward: tuple[tuple[int, ...], ...]
    backward: tuple[tuple[int, ...], ...]
    handoff_bytes: float | None = None
    handoff_s: float | None = None
    handoffs: int | None = None
    chunks: int = 1

    @property
    def label(self) -> str:
        """The graph's words for the stack: "stages: 2 over stage, 2 layers each" (circular:
        "stages: 2 over stage, 2 runs of 1 layer each")."""
        each = self.layers // (self.stages * self.chunks)
        runs = f"{self.chunks} runs of " if self.chunks > 1 else ""
        return (f"stages: {self.stages} over {self.axis}, {runs}{each} "
                f"layer{'s' if each > 1 else ''} each")

    def stage_layers(self, stage: int) -> str:
        """The layers stage `stage` holds: "layers 2-3"; circular "layers 1, 3" (one range
        per run)."""
        each = self.layers // (self.stages * self.chunks)
        spans = []
        for r in range(self.chunks):
            lo = (r * self.stages + stage) * each
            spans.append(f"{lo}" if each == 1 else f"{lo}-{lo + each - 1}")
        many = self.chunks > 1 or each > 1
        return f"layer{'s' if many else ''} {', '.join(spans)}"


@dataclass(frozen=True)
class ClassView:
    """A class and its choices. bytes: at stake — the bytes of the values whose layout
    deciding it changes, summed over the step (not memory held at once). minor: under
    MINOR_SHARE of the largest class's bytes (shown under one "minor" entry). legend: the
    legend shows it (the plan shards it, or it is among the largest): its own colour; every
    other class is drawn neutral."""

    id: int
    name: str
    size: int
    bytes: int
    layers: int
    color: str
    axes: tuple[str, ...]
    pinned: bool
    choices: tuple[ChoiceView, ...]
    minor: bool = False
    legend: bool = False


@dataclass(frozen=True)
class ConflictView:
    """A conflict. active: its class is sharded, so the resolution matters (an inactive one
    costs nothing and is no warning). labels: each resolution in words, in the order of
    `resolutions` ("keep the query positions", "gather both")."""

    id: int
    name: str
    class_id: int
    class_name: str
    where: str
    source: str
    active: bool
    resolution: str
    resolutions: tuple[str, ...]
    pinned: bool
    choices: tuple[ChoiceView, ...]
    labels: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The current resolution in words."""
        if self.labels and self.resolution in self.resolutions:
            return self.labels[self.resolutions.index(self.resolution)]
        return self.resolution


@dataclass(frozen=True)
class GroupView:
    """A group of the scope tree. ops, compute_s, comm_s: its whole subtree, every layer."""

    id: str
    label: str
    parent: str | None
    children: tuple[str, ...]
    repeat: int
    ops: int
    compute_s: float
    comm_s: float
    classes: tuple[int, ...]
    conflicts: tuple[int, ...]
    expanded: bool


@dataclass(frozen=True)
class NodeView:
    """A drawn node. sharded: the classes the plan shards on what it computes (its colours)."""

    id: str
    kind: str               # "group" | "op" | "input" | "output"
    group: str | None
    label: str
    op: int | None
    classes: tuple[int, ...]
    conflicts: tuple[int, ...]
    compute_s: float
    comm_s: float
    collectives: tuple[str, ...]
    sharded: tuple[int, ...] = ()


@dataclass(frozen=True)
class EdgeView:
    """Tensors from one drawn node to another. sharded: classes the plan shards on them."""

    id: str
    source: str
    target: str
    classes: tuple[int, ...]
    label: str
    badge: str | None
    sharded: tuple[int, ...] = ()


@dataclass(frozen=True)
class GraphView:
    dot: str
    nodes: tuple[NodeView, ...]
    edges: tuple[EdgeView, ...]


@dataclass(frozen=True)
class ExpertRow:
    """An expert strategy on the same cost model. ruled_out_by: the pins it contradicts
    ("batch=data"): a search under them cannot reach it."""

    name: str
    step_time_s: float
    peak_memory_bytes: float
    feasible: bool
    classes: Mapping[str, tuple[str, ...]]
    ruled_out_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class StartView:
    """The plan the session started on: name ("fsdp", "search", "your plan"), how ("expert",
    "search", "given", "smallest", or "unpriced": shown until the prices come), its step time
    (s) and peak (bytes; None while unpriced), why (note), and the header's words (label:
    "start: fsdp, 31.8 ms", "start until priced: fsdp")."""

    name: str
    how: str
    step_time_s: float | None
    peak_memory_bytes: float | None
    note: str
    label: str


@dataclass(frozen=True)
class SearchView:
    """history rows: (t s, simulations, best step s, its peak bytes). message: how the last
    search ended (None while none has)."""

    running: bool
    simulations: int
    elapsed_s: float
    sims_per_s: float
    best_step_time_s: float | None
    history: tuple[tuple[float, float, float, float], ...]
    message: str | None = None


@dataclass(frozen=True)
class TensorView:
    """A tensor under the plan. dim_axes: the mesh axes of each dim (major to minor), from
    which the view draws which device holds which block."""

    value: int
    shape: tuple[int, ...]
    dtype: str
    classes: tuple[str | None, ...]
    spec: str
    dim_axes: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class RemedyView:
    """A choice that removes a collective, priced from the current plan like the Decisions
    tab's choices. name / value: what to pin (a class and its axes, a conflict and its
    resolution); label: in words ("seq → replicated", "keep the key positions")."""

    name: str
    value: tuple[str, ...] | str | int
    label: str
    step_time_s: float
    peak_memory_bytes: float


@dataclass(frozen=True)
class CollectiveView:
    """One collective a drawn op pays, explained. op: the op (its first layer's, where layers
    are drawn once); operand: the position of the operand it moves (None: the op's partial
    results); tensor: that value's type; classes: the classes that ask for it; why: in words;
    count, bytes, time_s: per step, every layer together; patterns: the compiler patterns
    that decided it, where the cost model names them; remedy: the cheapest choice found that
    removes it (None when none of those tried does)."""

    op: int
    primitive: str
    source: str
    scope: str
    kind: str
    axes: tuple[str, ...]
    label: str
    operand: int | None
    tensor: str
    classes: tuple[str, ...]
    why: str
    count: float
    bytes: float
    time_s: float
    layers: int
    patterns: tuple[str, ...]
    remedy: RemedyView | None


@dataclass(frozen=True)
class ExplainedView:
    """The collectives of what is selected: an op's, or those paid on a drawn edge's
    tensors. subject: what in words ("dot_general (op 41)", "attn → mlp")."""

    kind: str               # "op" | "edge"
    id: str
    subject: str
    collectives: tuple[CollectiveView, ...]


@dataclass(frozen=True)
class DetailsView:
    op: int
    primitive: str
    source: str
    scope: str
    operands: tuple[TensorView, ...]
    results: tuple[TensorView, ...]
    compute_s: float
    comm_s: float
    collectives: tuple[str, ...]


@dataclass(frozen=True)
class MemoryView:
    """Live bytes per device over one step of the plan (CostModel.memory_timeline), drawn as
    the memory chart: bytes stacked by category over program order.

    steps: the ops of the step, at positions 0..steps-1 in the order the compiler runs them;
    positions: [M] the positions drawn, ascending: every one when steps <= MAX_SAMPLES, else
    the most and the least live position of each equal stretch of the step, the first, the
    last and the peak (_memory.py); ops: [M] the op at each; categories: {name: [M] bytes},
    whole bytes, in MEMORY_CATEGORIES order (the bottom of the stack first); peak_position,
    peak_op, peak_bytes: where the live bytes are largest and how many (the estimate's
    peak_memory_bytes); peak_primitive, peak_source, peak_scope: that op in words.
    """

    steps: int
    positions: tuple[int, ...]
    ops: tuple[int, ...]
    categories: Mapping[str, tuple[int, ...]]
    peak_position: int
    peak_op: int
    peak_bytes: float
    peak_primitive: str = ""
    peak_source: str = ""
    peak_scope: str = ""

    def at_peak(self) -> dict[str, int]:
        """{category: bytes} at the peak position (one of the positions drawn)."""
        if not self.positions:
            return {}
        k = self.positions.index(self.peak_position)
        return {name: values[k] for name, values in self.categories.items()}


@dataclass(frozen=True)
class Selection:
    kind: str               # "op" | "group" | "class" | "conflict" | "edge"
    id: str


@dataclass(frozen=True)
class ViewModel:
    """What the Lab draws for one state of a session (labextension/src/viewmodel.ts's fields)."""

    program: Mapping[str, Any]
    mesh: Mapping[str, Any] | None
    classes: tuple[ClassView, ...]
    conflicts: tuple[ConflictView, ...]
    groups: tuple[GroupView, ...]
    graph: GraphView
    estimate: Mapping[str, Any] | None
    experts: tuple[ExpertRow, ...]
    search: SearchView
    snippet: str
    error: str | None
    selected: Selection | None
    details: DetailsView | None
    pinned: tuple[str, ...]
    notice: str | None = None   # what the last action did besides the obvious (not an error)
    start: StartView | None = None        # the plan the session started on
    explained: ExplainedView | None = None  # the selected op's or edge's collectives
    memory: MemoryView | None = None      # live bytes over the step (None: no mesh)
    steps: tuple[StepDecisionView, ...] = ()  # remat per layer group, micro-batches, stages
    schedule: ScheduleView | None = None  # the pipeline's ticks (None: no stages)
    # Why the prices (estimate, choices, expert plans, memory) are not there yet, in words
    # ("compiling the cost model (...)"); None once they are. The view draws "–" meanwhile.
    pricing: str | None = None
    format: str = FORMAT
    version: int = VERSION

    # --- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """Plain JSON types (lists, dicts, str, numbers, None), field names as in the contract."""
        return _plain(self)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, doc: Mapping) -> "ViewModel":
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise ValueError(f"not a toast-lab view model of version {VERSION}: format "
                             f"{doc.get('format')!r}, version {doc.get('version')!r}")
        return _build(cls, doc)

    @classmethod
    def from_json(cls, text: str) -> "ViewModel":
        return cls.from_dict(json.loads(text))

    # --- looking things up ----------------------------------------------------------------------

    def node(self, node_id: str) -> NodeView:
        for n in self.graph.nodes:
            if n.id == node_id:
                return n
        raise KeyError(f"no node {node_id!r} in the drawn graph")

    def group(self, group_id: str) -> GroupView:
        for g in self.groups:
            if g.id == group_id:
                return g
        raise KeyError(f"no group {group_id!r}; groups: {[g.id for g in self.groups][:20]}")

    # --- text -----------------------------------------------------------------------------------

    def to_text(self) -> str:
        from ._text import render
        return render(self)

    __str__ = to_text

    def __repr__(self) -> str:
        est = self.estimate
        step = f"; step {est['step_time_s'] * 1e3:.3f} ms" if est else ""
        return (f"ViewModel({self.program.get('name')!r}: {len(self.graph.nodes)} nodes, "
                f"{len(self.graph.edges)} edges, {len(self.classes)} classes, "
                f"{len(self.conflicts)} conflicts{step})")


def saved_view(view: dict) -> dict:
    """A view model (as a dict) the way a plan file or a plan output keeps it: without the
    moment's error, notice, selection, op details and explanation, and without the session's
    start (the file holds one plan), and not searching. Keys it lacks stay absent."""
    out = dict(view)
    for key in ("error", "notice", "selected", "details", "explained", "start"):
        if key in out:
            out[key] = None
    if isinstance(out.get("search"), dict):
        out["search"] = dict(out["search"], running=False)
    return out


# --- dataclasses <-> JSON ---------------------------------------------------------------------

_FIELDS: dict[type, tuple[str, ...]] = {}
_INF = float("inf")


def _plain(x):
    """`x` as JSON types: dataclasses as dicts, tuples as lists, NaN/inf as None. Hand-written
    (not dataclasses.asdict, which deep-copies): the view is rebuilt on every pin."""
    t = type(x)
    if t is str or t is int or t is bool or x is None:
        return x
    if t is float:
        return x if x == x and -_INF < x < _INF else None
    if t is tuple or t is list:
        return [_plain(v) for v in x]
    if t is dict:
        return {str(k): _plain(v) for k, v in x.items()}
    names = _FIELDS.get(t)
    if names is None and is_dataclass(x):
        names = _FIELDS[t] = tuple(f.name for f in fields(t))
    if names is not None:
        return {n: _plain(getattr(x, n)) for n in names}
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if hasattr(x, "item"):  # numpy scalars
        return _plain(x.item())
    return x


def _build(tp, data):
    """`data` (from JSON) as type `tp`: dataclasses, tuples, unions with None, mappings."""
    if data is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if type(data) in (str, int, float, bool) and type(data) in options:
            return data
        for a in options:
            if a not in (str, int, float, bool):
                return _build(a, data)
        return data
    if is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        kwargs = {f.name: _build(hints[f.name], data[f.name])
                  for f in fields(tp) if f.name in data}
        return tp(**kwargs)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in data)
        return tuple(_build(a, v) for a, v in zip(args, data))
    if origin in (collections.abc.Mapping, dict) or tp is Any:
        if isinstance(data, Mapping):
            args = typing.get_args(tp)
            if args and args[1] is not Any:
                return {k: _build(args[1], v) for k, v in data.items()}
            return dict(data)
        return data
    return data


__all__ = ["ViewModel", "ClassView", "ConflictView", "ChoiceView", "StepDecisionView",
           "ScheduleView", "GroupView", "GraphView",
           "NodeView", "EdgeView", "ExpertRow", "StartView", "SearchView", "DetailsView",
           "TensorView", "RemedyView", "CollectiveView", "ExplainedView", "MemoryView",
           "Selection",
           "FORMAT", "VERSION", "saved_view"]
