"""Which operand reads one reshard serves: the *shared reads* the types cost once per plan.

XLA's CSE merges the reshards of one value that several ops of one CSE group read (remat
regions are groups of their own), and loop-invariant code motion reshards a scan's constants
once, before the loop, whichever ops read them there. A read of a relayout of a value (a
transpose, a reverse, a reshape) is a read of that value: the SPMD partitioner reshards the
relayout's operand to the op's own sharding (gather_sources). Each such *sharing unit* read
more than once (or hoisted out of a loop) is one shared read per reading op, costed together;
the others stay members of their op's type (_op_types.py).

Built from the static tables (_static.py) and the analysis, once per device (_types.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..analysis import domain_boundaries
from ._interning import records
from ._tables import SHARED_READ, SPAN

_I = np.int64

# Ops that only relayout their operand: same elements, same dtype, no arithmetic.
_RELAYOUT = frozenset({"rev", "transpose", "reshape", "squeeze", "expand_dims", "copy"})
# Those the compiler writes out as a buffer of their own: a reverse moves every element
# (XLA:CPU keeps `reverse(all-gather(w))` as its own op feeding a convolution's input
# gradient, cnn fsdp, jax 0.10.2); a reshape, squeeze or expand_dims is a bitcast, and a
# transpose is mostly folded into its reader's layout.
_MATERIALISED = frozenset({"rev"})


class ReadSharing(NamedTuple):
    """Per operand of the static tables ([O]) and per value ([V])."""

    source: np.ndarray          # [V] the value each value is a relayout of (gather_sources)
    unit: np.ndarray            # [O] its sharing unit (operands of one unit share a reshard)
    shared: np.ndarray          # [O] bool: its read is a shared read
    loop: np.ndarray            # [O] the loop its read is hoisted out of (-1: none)


class SharedReads(NamedTuple):
    shared_values: np.ndarray   # SPAN records: per sharing unit, the run of its shared reads
    shared_reads: np.ndarray    # SHARED_READ records, one per shared operand read
    operand_read: np.ndarray    # [O] each operand's shared read (-1: none)
    read_loop: np.ndarray       # [S] the loop each shared read is hoisted out of (-1: none)


def read_sharing(st, prog) -> ReadSharing:
    """The ReadSharing of static tables `st` of program `prog`."""
    operands = st.operands
    # A value read by several ops of one CSE group (remat regions are their own groups); a
    # read of a relayout of a value is a read of that value (see gather_sources).
    group_of_op = np.array([op.cse_group for op in prog.ops], _I)
    source = gather_sources(prog)
    # A loop-invariant read (a scan's constant, or a relayout of one) is resharded before the
    # loop (PassAnalyses.invariant_loop): once per loop and sharding, whichever ops read it
    # there.
    read_of = source[operands.value]
    loop_of = st.passes.invariant_loop[read_of]
    hoisted = loop_of >= 0
    read_of = np.where(hoisted, source[st.passes.invariant_source[read_of]], read_of)
    groups_count = group_of_op.max(initial=0) + 2  # a program of no ops has no groups
    unit = read_of * groups_count + np.where(hoisted, groups_count - 1,
                                             group_of_op[operands.op])
    # Reads of their own: a loop's gather of its stack, not CSE'd with other reads
    # (_operand_rows.py, scans), and a relayout's read of its operand (it reshards nothing
    # there, passing the sharding through: its readers' reads are the value's).
    ops = prog.ops
    linked = np.array([ops[n].primitive in _RELAYOUT and len(ops[n].results) == 1
                       and source[ops[n].results[0]] != ops[n].results[0]
                       for n in operands.op.tolist()], bool)
    own = st.ops.is_region[operands.op] | linked
    unit = np.where(own, -1 - np.arange(len(unit)), unit)
    _, unit_id, uses = np.unique(unit, return_inverse=True, return_counts=True)
    return ReadSharing(source, unit_id, (uses[unit_id] >= 2) | hoisted, loop_of)


def shared_reads(st, an, sharing: ReadSharing, operand_type: np.ndarray,
                 op_type: np.ndarray) -> SharedReads:
    """The SharedReads of static tables `st` of analysis `an`, given each operand's and op's
    type."""
    prog, operands = an.program, st.operands
    inst = np.nonzero(sharing.shared)[0]
    inst = inst[np.lexsort((operands.op[inst], sharing.unit[inst]))]
    units = sharing.unit[inst]
    ptr = np.r_[0, np.nonzero(np.diff(units))[0] + 1, len(units)].astype(_I) \
        if len(units) else np.zeros(1, _I)
    op_of_read = operands.op[inst]
    pinned = np.zeros(len(prog.values), bool)  # what plan.jit pins under overrides
    pinned[list(domain_boundaries(an))] = True
    read_loop = sharing.loop[inst]
    at = np.where(read_loop >= 0, read_loop, op_of_read)  # where the reshard runs
    value = operands.value[inst]
    reads = records(SHARED_READ, operand_type=operand_type[inst],
                    op_type=op_type[op_of_read], position=at,
                    trip=st.ops.trip[at], nbytes=operands.nbytes[inst],
                    early=st.passes.early[value],
                    pinned=gather_sources(prog, pinned)[value],
                    memory_position=at, ready=at,
                    copy_of=np.where(materialised(prog, sharing.source)[value], value, -1))
    operand_read = np.full(len(operands.op), -1, _I)
    operand_read[inst] = np.arange(len(inst))
    return SharedReads(records(SPAN, start=ptr[:-1], end=ptr[1:]), reads, operand_read,
                       read_loop)


def materialised(prog, source: np.ndarray) -> np.ndarray:
    """[V] bool: the value is a relayout, somewhere along its chain back to its gather source
    (`source`: gather_sources), that the compiler writes out: reading it costs a buffer of its
    own."""
    out = np.zeros(len(prog.values), bool)
    for op in prog.ops:  # program order, as in gather_sources
        if op.primitive not in _RELAYOUT or op.body or len(op.operands) != 1 \
                or len(op.results) != 1 or source[op.results[0]] == op.results[0]:
            continue
        out[op.results[0]] = op.primitive in _MATERIALISED or out[op.operands[0]]
    return out


def gather_sources(prog, pinned=None) -> np.ndarray:
    """[V] the value each value is a relayout of (itself where it is none): follows chains of
    _RELAYOUT ops back to the value they start from, stopping at `pinned` values ([V] bool).

    XLA gathers a relayout's source rather than the relayout: the SPMD partitioner reshards
    a reverse's or transpose's operand to the op's own sharding (spmd_partitioner.cc,
    HandleReverse), and sharding propagation gives the op the sharding its reader asks for,
    so the all-gather lands on the source and is CSE'd with that value's other gathers. A
    convolution's input gradient reads its kernel through `rev`; with FSDP XLA gathers the
    kernel once, for the forward and the backward (cnn, jax 0.10.2: `reverse(all-gather(w))`),
    where gathering `rev(w)` again would double the kernel's gather bytes. A value plan.jit
    pins with a sharding constraint keeps its own sharding, so propagation stops there."""
    values = prog.values
    source = np.arange(len(values), dtype=_I)
    for op in prog.ops:  # program order: an operand's source is known before its readers
        if op.primitive not in _RELAYOUT or op.body or len(op.operands) != 1 \
                or len(op.results) != 1:
            continue
        u, v = op.operands[0], op.results[0]
        if pinned is not None and pinned[v]:
            continue
        if values[u].nbytes == values[v].nbytes and values[u].dtype == values[v].dtype:
            source[v] = source[u]
    return source
