"""Halo exchanges of spatially sharded convolutions: the HALO_EXCHANGE pattern (_patterns.py).

A convolution whose result shards a windowed dim (rows of an image over `data`) needs, on each
device, input rows its neighbours hold: XLA's partitioner slices the input like the result and
exchanges the missing rows by collective-permute (PartitionedHlo::ReshardAsWindowedInput,
ExchangeHalo in xla/service/spmd/spmd_partitioner.cc).
"""

from __future__ import annotations


from ._jit import jit
from ._charge import CP, charge
from ._patterns import HALO_EXCHANGE


@jit
def halo_sizes(h, n):
    """(left, right, span) of windowed dim `h` (a HALO record) of a convolution whose result
    is sharded `n` ways on it: the most input rows a shard takes from its left and its right
    neighbours' shards, and the rows of input each shard's windows span; (0, 0, 0) where
    XLA's partitioner does not exchange halos (then it computes the convolution from the
    whole input it was given and slices the result, no communication).

    PartitionedHlo::ReshardAsWindowedInput (spmd_partitioner.cc), which the convolution
    handler's PartitionConvolutionTiledOutput calls once it has sliced the input like the
    result: each of the n shards computes p = out / n windows; on the input padded with
    E = lo / b rows and dilated by b, shard j reads [start(j), limit(j)) with
        start(j) = (s p j + b - 1 - lo % b) / b
        limit(j) = (s p j + s (p - 1) + (k - 1) d + 1 + b - 1 - lo % b) / b
    (s stride, k window, d its dilation, b the input's, integer division), and holds
    [L j + E, L (j + 1) + E), L = ceil(in / n). Its left halo is L j + E - start(j), its right
    limit(j) - L (j + 1) - E; ExchangeHalo sends the largest left halo of shards 1..n-1 and
    the largest right halo of shards 0..n-2, in pieces of at most L rows, one
    collective-permute per piece and side (3x3 SAME stride 1: one row each way; stride 2:
    one row from the right only; 7x7 SAME stride 2: 2 rows from the left, 3 from the right;
    checked on 8 CPU devices, jax 0.10.2, tests/test_cost_halo.py). C++ division: E and
    lo % b truncate toward zero (a transposed convolution's padding may be negative). It
    gives up (returns nullopt, and the input stays whole) where s != 1 and s p is not a
    multiple of b, and ExchangeHalo where the halos and the shard cover every shard's rows
    while one side reaches past the next shard (left + right + L >= n L and left or right
    > L: a kernel gradient with the kernel's rows over data=4, halos of 9 rows over shards
    of 4; over model=2 it exchanges 6 of 8), or no row of its own shard is useful; halos of
    more than twice the span take ExchangeHaloCompact, which is not modelled: nothing is
    charged there."""
    k = h.window
    s = h.stride
    b = h.base_dilation
    lo = h.padding_low
    p = h.out_size // n
    dilated = (k - 1) * h.window_dilation + 1
    if p <= 0 or (s != 1 and (s * p) % b != 0):
        return 0, 0, 0
    E = abs(lo) // b if lo >= 0 else -(abs(lo) // b)
    plo = lo - E * b  # in (-b, b): the numerators below are never negative
    L = -(-h.in_size // n)
    span_s = s * (p - 1) + dilated
    left = -(1 << 62)
    right = -(1 << 62)
    left_all = -(1 << 62)
    right_all = -(1 << 62)
    span = 0
    for j in range(n):
        start = (s * p * j + b - 1 - plo) // b
        limit = (s * p * j + span_s + b - 1 - plo) // b
        left_all = max(left_all, L * j + E - start)
        right_all = max(right_all, limit - L * (j + 1) - E)
        if j >= 1:
            left = max(left, L * j + E - start)
        if j <= n - 2:
            right = max(right, limit - L * (j + 1) - E)
        span = max(span, limit - start)
    if (left + right + L >= L * n and (left > L or right > L)) or -left_all >= L + right_all \
            or max(left, right) > 2 * span:
        return 0, 0, 0
    return left, right, span

@jit
def halo_exchange(coll, op, halos, eff, psum, mesh, w, ledger, row):
    """The halo exchanges of a convolution whose result shards windowed dims (OP.halo_start;
    _halo_sizes says how many rows): charges their collective-permutes over each dim's axes
    (ledger rows row + h) and returns (seconds, bytes of the input shard with its halos, a
    buffer at the op).

    XLA slices the input like the result (its batch like the result's batch, its features on
    the axes the contraction is sharded over), then exchanges each sharded windowed dim in
    the input's dim order, the rows it sends spanning the dims done before with their halos
    (ReshardAsWindowedInput's loop over dims; height on data and width on model: the width
    halo is 1 + 4 + 1 rows high). plan.jit hands it the input whole on those dims (the rule's
    need-replication), so this comes on top of that all-gather: the partitioner slices the
    gathered input to the result's sharding first, then exchanges halos of the slice.

    An axis that shards the contracted features as well as a windowed dim of the result (a
    random plan's collision) is the dot handler's first: it partitions the contraction over
    that axis and the windowed dim stays whole within each group, to be sliced after the
    reduction (haiku-resnet: features and rows on model, columns on data: halos of
    [8, 4, 1, 4], rows whole, over data only; jax 0.10.2)."""
    rt = op.result_type
    mask = psum | eff[rt, op.halo_batch]
    unit = op.halo_nbytes / mesh[mask].ways
    held = 1.0  # the input's rows per device before the exchanges (its slice)
    for i in range(op.halo_start, op.halo_end):
        h = halos[i]
        unit /= h.in_size
        n = int(mesh[eff[rt, h.result_dim] & ~psum].ways)
        held *= h.in_size if n <= 1 else -(-h.in_size // n)
    seconds = 0.0
    exchanged = False
    done = 1.0  # extents of the dims exchanged so far, with their halos, over their slices
    for i in range(op.halo_start, op.halo_end):
        h = halos[i]
        m = eff[rt, h.result_dim] & ~psum
        n = int(mesh[m].ways)
        if n <= 1:
            continue
        L = -(-h.in_size // n)
        left, right, span = halo_sizes(h, n)
        if span == 0:
            continue
        rows = max(left, 0) + max(right, 0)
        count = -(-max(left, 0) // L) + -(-max(right, 0) // L)
        if count > 0:
            nbytes = unit * held * done / L * rows
            hop = mesh[m]
            t = nbytes * hop.permute_beta + count * hop.permute_alpha
            charge(coll, CP, m, w * count, nbytes / count, t / count, ledger, row + i,
                   HALO_EXCHANGE)
            seconds += t
            exchanged = True
        done *= span / L
    return seconds, unit * held * done if exchanged else 0.0
