"""What one collective costs, and how a charge is recorded.

Every phase charges collectives through `charge` (or `permute`): it adds `weight` collectives of
one kind over a mesh-axis mask to the plan's totals (`coll[kind, mask]`: count, bytes, seconds)
and, when the ledger has rows, records them in the ledger row of the place that charged them,
with the partitioner pattern (_patterns.py) that decided it. The hot path passes a ledger of no
rows and records nothing.

Times follow the alpha-beta model of the MESH table (one record per axis mask, built by
cost/_collectives.py).
"""

from __future__ import annotations
from ._jit import inline


# collective kinds, in the order of COLLECTIVE_KINDS
AR, AG, RS, A2A, CP = 0, 1, 2, 3, 4
NUM_KINDS = 5
# the columns of `coll[kind, mask]`
C_COUNT, C_BYTES, C_SECONDS = 0, 1, 2


@inline
def gather_time(nbytes, mask, mesh):
    """Seconds of an all-gather producing, or a reduce-scatter consuming, a buffer of nbytes
    per device over the axes of `mask` (an all-reduce is one of each)."""
    cost = mesh[mask]
    if nbytes <= 0.0 or cost.ways <= 1.0:
        return 0.0
    return nbytes * cost.gather_beta + cost.gather_alpha


@inline
def a2a_time(nbytes, mask, mesh):
    """Seconds of an all-to-all of a shard of nbytes per device over the axes of `mask`."""
    cost = mesh[mask]
    if nbytes <= 0.0 or cost.ways <= 1.0:
        return 0.0
    return nbytes * cost.a2a_beta + cost.gather_alpha


@inline
def permute_time(nbytes, mask, mesh):
    """Seconds of a collective-permute over the axes of `mask`, each device sending nbytes,
    one hop."""
    hop = mesh[mask]
    return nbytes * hop.permute_beta + hop.permute_alpha


@inline
def charge(coll, kind, mask, weight, nbytes, seconds, ledger, row, pattern):
    """Adds `weight` collectives of one kind over `mask`, each moving nbytes in seconds, and
    records them in ledger row `row` with the pattern that charged them (when the ledger has
    rows)."""
    coll[kind, mask, C_COUNT] += weight
    coll[kind, mask, C_BYTES] += nbytes * weight
    coll[kind, mask, C_SECONDS] += seconds * weight
    if row < ledger.shape[0]:
        entry = ledger[row]
        entry.kind = kind
        entry.mask = mask
        entry.count = weight
        entry.bytes = nbytes
        entry.seconds = seconds
        entry.pattern = pattern


@inline
def permute(coll, mask, weight, nbytes, mesh, ledger, row, pattern):
    """Charges `weight` collective-permutes over the axes of `mask`, each device sending
    nbytes, one hop; returns the seconds of one."""
    t = permute_time(nbytes, mask, mesh)
    charge(coll, CP, mask, weight, nbytes, t, ledger, row, pattern)
    return t
