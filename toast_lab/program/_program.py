"""The traced program: values and ops, flat, in program order (DESIGN.md §1).

Regions (`scan`, `while`, `cond`) stay in the flat list: the region op comes first, then its
body ops (`Op.region` points back at it), so one walk over `Program.ops` sees every op once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

# Where a value comes from.
INPUT = "input"        # a leaf of the function's arguments
CONST = "const"        # a constant captured by the traced function
LITERAL = "literal"    # a literal scalar in an equation
RESULT = "result"      # produced by an op
BODY_INPUT = "body"    # an input of a region body (defined by the region op)

NO_OP = -1  # sentinel: a value with no producing op, or an op outside any region

# Call-like primitives the tracer inlines into their callers (their name scope kept).
# custom_linear_solve (jnp.linalg.solve, jax.scipy.linalg.cho_solve, lax.custom_linear_solve)
# is one too: JAX lowers it to its `solve` jaxpr applied to that jaxpr's consts and `b`.
INLINED_PRIMITIVES = frozenset({
    "jit", "pjit", "closed_call", "core_call", "remat", "remat2", "checkpoint",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin",
    "custom_linear_solve",
})

# Primitives whose bodies stay as regions, analysed once (DESIGN.md §1).
REGION_PRIMITIVES = frozenset({"scan", "while", "cond"})


@dataclass(frozen=True, slots=True)
class Value:
    """One tensor of the program. `shape` in elements; `nbytes` for the whole (unsharded) tensor."""

    id: int
    shape: tuple[int, ...]
    dtype: np.dtype
    origin: str
    producer: int = NO_OP
    name: str = ""  # for inputs: the pytree path, e.g. "params/blocks/0/attn/wq"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __repr__(self) -> str:
        dims = ",".join(map(str, self.shape))
        label = f" {self.name}" if self.name else ""
        return f"%{self.id}:{self.dtype.name}[{dims}]{label}"


@dataclass(frozen=True, slots=True, eq=False)
class Op:
    """One equation. `trip_count`: how often it runs per call (scan bodies run `length` times)."""

    id: int
    primitive: str
    params: Mapping[str, Any]
    operands: tuple[int, ...]
    results: tuple[int, ...]
    name_scope: str
    source_info: Any = field(repr=False)
    region: int = NO_OP
    trip_count: int = 1
    body: tuple[int, ...] = ()      # region ops: body inputs and outputs, in the rule's order
    body_ops: tuple[int, int] = (0, 0)  # region ops: [start, stop) of their body ops' ids
    body_ranges: tuple[tuple[int, int], ...] = ()  # region ops: [start, stop) of each body
    jax_primitive: Any = field(default=None, repr=False)  # the jax Primitive, to re-bind the op
    cse_group: int = 0  # ops of one remat region (prevent_cse) share a group; 0: none
    # The part of name_scope the user wrote: their named scopes and jitted functions, without
    # the names of library helpers inlined into it (jnp.einsum's 'bsd,dhk->bshk', '_where').
    user_scope: str = ""
    # The name stack as JAX recorded it, transformations included, joined through the calls
    # inlined around the op: 'transpose(jvp(block0))/attn' for an op of the backward pass.
    name_stack: str = ""

    @property
    def source(self) -> str:
        """The user's source line, e.g. 'model.py:42 (attention)'; for an op inside a library
        helper, the line that called the helper."""
        return source_line(self.source_info)

    def __repr__(self) -> str:
        ins = ", ".join(f"%{v}" for v in self.operands)
        outs = ", ".join(f"%{v}" for v in self.results)
        scope = f" [{self.name_scope}]" if self.name_scope else ""
        return f"{outs} = {self.primitive}({ins}){scope}"


def source_line(source_info) -> str:
    if source_info is None:
        return "<unknown>"
    from jax._src import source_info_util  # private, but the only way to JAX's user frame

    try:
        return source_info_util.summarize(source_info) or "<unknown>"
    except Exception:  # a source line is a courtesy: never let it break analysis
        return "<unknown>"


def user_line(source_info) -> str:
    """The line of the user's own code that led to an op: its innermost frame outside
    installed packages (site-packages, dist-packages), as 'model.py:42:8 (Net.__call__)': for an
    op inside flax's BatchNorm, the line that called the BatchNorm. `source_line` where every
    frame is the user's, or none is."""
    from jax._src import source_info_util  # private, but the only way to JAX's user frames

    tb = getattr(source_info, "traceback", None)
    try:
        frames = list(source_info_util.user_frames(tb)) if tb is not None else []
    except Exception:  # a source line is a courtesy: never let it break analysis
        frames = []
    for f in frames:  # innermost first
        if "site-packages" not in f.file_name and "dist-packages" not in f.file_name:
            return f"{f.file_name}:{f.start_line}:{f.start_column} ({f.function_name})"
    return source_line(source_info)


def call_name(qualname: str, library: bool = False) -> str:
    """The name of a call, as a user would say it: 'loss_fn' for the user's
    `train_step.<locals>.loss_fn`, but 'scale_by_adam' for a library's
    `scale_by_adam.<locals>.update_fn` (a closure a library hands out is named by the function
    that made it); 'Block' for 'Block.__call__'; '' for a lambda, a comprehension, a module."""
    parts = qualname.split(".<locals>.")
    name = parts[0] if library else parts[-1]
    if name.startswith("<"):  # <lambda>, <listcomp>, <module>
        return ""
    head, _, tail = name.rpartition(".")
    return head if head and tail.startswith("__") else name


class Program:
    """A traced function: values, ops in program order, and the argument/result structure."""

    def __init__(self, values, ops, inputs, outputs, in_tree, out_tree, input_names,
                 dim_names, fn_name: str, constants=None, fn=None, elided=(),
                 annotated_names=None):
        self.values: tuple[Value, ...] = tuple(values)
        self.ops: tuple[Op, ...] = tuple(ops)
        self.inputs: tuple[int, ...] = tuple(inputs)
        self.outputs: tuple[int, ...] = tuple(outputs)
        self.in_tree = in_tree      # PyTreeDef of (args, kwargs)
        self.out_tree = out_tree
        self.input_names: tuple[str, ...] = tuple(input_names)
        # Per input leaf: logical dim names the user (or the zoo) gave, or None.
        self.dim_names: tuple[tuple[str | None, ...] | None, ...] = tuple(dim_names)
        # Per input leaf: the logical axis names flax keeps on it (program/_annotations.py),
        # or None; the names above win where both name a class.
        self.annotated_names: tuple[tuple[str | None, ...] | None, ...] = (
            tuple(annotated_names) if annotated_names is not None
            else (None,) * len(self.inputs))
        self.fn_name = fn_name
        self.fn = fn  # the traced function itself (plan.jit accepts it without re-tracing)
        # Literal and captured-constant values: value id -> array or scalar.
        self.constants: dict[int, Any] = dict(constants or {})
        self.elided: tuple[tuple[int, str, str], ...] = tuple(elided)
        users: list[list[int]] = [[] for _ in self.values]
        for op in self.ops:
            for v in op.operands:
                users[v].append(op.id)
            for v in op.body:  # body outputs are read by the region op
                if self.values[v].origin != BODY_INPUT:
                    users[v].append(op.id)
        self._users = tuple(tuple(u) for u in users)

    def users(self, value: int) -> tuple[int, ...]:
        return self._users[value]

    def outer_operand(self, value: int) -> int:
        """The region operand a body input stands for (a scan's or cond's operand, a while
        loop's const or carry init), or `value` itself where it is no body input."""
        val = self.values[value]
        if val.origin != BODY_INPUT:
            return value
        op = self.ops[val.producer]
        t = op.body.index(value)
        if op.primitive == "cond":  # per branch: its inputs (operands[1:]), then its outputs
            per_branch = len(op.operands) - 1 + len(op.results)
            return op.operands[1 + t % per_branch]
        if op.primitive == "while":  # [cond consts, carry] then [body consts, carry]
            cc, bc, n = op.params["cond_nconsts"], op.params["body_nconsts"], len(op.results)
            if t < cc:
                return op.operands[t]
            if t < cc + n:
                return op.operands[cc + bc + t - cc]
            t -= cc + n
            return op.operands[cc + t] if t < bc else op.operands[cc + bc + t - bc]
        return op.operands[t]  # scan and the rest: body inputs in operand order

    def handed_on_stacks(self) -> tuple[tuple[int, int, int], ...]:
        """(scan op, stacked result, body output) of each stack a scan writes (ys) that no loop
        reads: what a step hands on from its layers, such as the per-layer gradients its
        optimizer updates. A stack another loop reads (the activations a forward scan keeps
        for the backward one) is left out."""
        out = []
        for op in self.ops:
            if op.primitive != "scan":
                continue
            nk = op.params["num_carry"]
            first_out = len(op.body) - len(op.results)
            for j in range(nk, len(op.results)):
                r = op.results[j]
                if not any(self.ops[u].body for u in self._users[r]):
                    out.append((op.id, r, op.body[first_out + j]))
        return tuple(out)

    def loop_only_stacks(self) -> tuple[int, ...]:
        """The stacks (ys) scans write that only other scans read, each of those reading it
        as a stack (xs), and that the step does not return: the activations a forward scan
        keeps for the backward one. A stack also read outside loops, or read whole (a
        scan's constant, a while's or cond's operand), is left out."""
        outputs = set(self.outputs)
        out = []
        for op in self.ops:
            if op.primitive != "scan":
                continue
            for r in op.results[op.params["num_carry"]:]:
                readers = [(self.ops[u], t) for u in self._users[r]
                           for t, w in enumerate(self.ops[u].operands) if w == r]
                if r not in outputs and readers and all(
                        o.primitive == "scan" and t >= o.params["num_consts"]
                        + o.params["num_carry"] for o, t in readers):
                    out.append(r)
        return tuple(out)

    @property
    def num_ops(self) -> int:
        return len(self.ops)

    def primitives(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.primitive] = counts.get(op.primitive, 0) + 1
        return counts

    def fingerprint(self) -> str:
        """A hash of the program's structure (inputs, primitives, shapes), not of its source.

        Plan files carry it so that loading a plan against another program fails clearly.
        Equations the tracer elides (stop_gradient) count where they were, so that a plan
        saved before the tracer learned to elide them still loads.
        """
        h = hashlib.sha256()
        for v in self.inputs:
            val = self.values[v]
            h.update(f"{val.name}:{val.dtype.name}{val.shape};".encode())
        elided = iter(self.elided)
        pending = next(elided, None)
        for op in self.ops:
            while pending is not None and pending[0] <= op.id:
                h.update(f"{pending[1]}{pending[2]};".encode())
                pending = next(elided, None)
            shapes = ",".join(str(self.values[r].shape) for r in op.results)
            h.update(f"{op.primitive}{shapes};".encode())
        while pending is not None:
            h.update(f"{pending[1]}{pending[2]};".encode())
            pending = next(elided, None)
        return h.hexdigest()[:16]

    def __repr__(self) -> str:
        return (f"Program({self.fn_name!r}, {len(self.inputs)} inputs, {len(self.ops)} ops, "
                f"{len(self.values)} values)")
