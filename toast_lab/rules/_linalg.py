"""Rules for contractions (dot_general, conv_general_dilated), matrix decompositions and FFT."""

from __future__ import annotations

from ._core import NEED_REPLICATION, PASS_THROUGH, REDUCTION, RuleBuilder
from ._helpers import expect, guarded, resized_dim, tie_same_shape
from ._table import register


@register("dot_general")
@guarded
def dot_general_rule(ins, outs, params):
    """Batch dims and free dims pass through; contracting dims are reductions (partial sums,
    all-reduce). Result dims are [batch..., lhs free..., rhs free...].

    Factors are numbered in the order of the lhs dims, then the rhs free dims, so a matmul prints
    ([i, j], [j, k])->([i, k]) reduction={j}.
    """
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    x, w = ins[0], ins[1]
    y = outs[0]
    expect(len(lc) == len(rc) and len(lb) == len(rb))
    lfree = [d for d in range(len(x)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(w)) if d not in rc and d not in rb]
    expect(len(y) == len(lb) + len(lfree) + len(rfree))
    out_of_lhs_free = {d: len(lb) + k for k, d in enumerate(lfree)}
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(x):
        if d in lb:
            k = lb.index(d)
            expect(w[rb[k]] == n == y[k])
            b.factor(n, operands={0: d, 1: rb[k]}, results={0: k})
        elif d in lc:
            r = rc[lc.index(d)]
            expect(w[r] == n)
            b.factor(n, REDUCTION, operands={0: d, 1: r})
        else:
            o = out_of_lhs_free[d]
            expect(y[o] == n)
            b.factor(n, operands={0: d}, results={0: o})
    for k, d in enumerate(rfree):
        o = len(lb) + len(lfree) + k
        expect(y[o] == w[d])
        b.factor(w[d], operands={1: d}, results={0: o})
    return b.build()


@register("ragged_dot_general")
@guarded
def ragged_dot_general_rule(ins, outs, params):
    """Grouped matmuls (mixture-of-experts layers): lhs rows come in groups of
    `group_sizes`, each multiplied by its group's rhs matrix. As in Shardy's rule for
    ragged_dot:

    - ragged non-contracting dim (lhs [m, k], rhs [g, k, n], group_sizes [g] -> [m, n]): m
      needs replication (which rows belong to which group depends on every group size before
      them), the group dim g of rhs and group_sizes needs replication, k is a reduction, n and
      the batch dims pass through.
    - ragged contracting dim (lhs [m, k], rhs [k, n], group_sizes [g] -> [g, m, n]): k needs
      replication, g is a result dim tied to group_sizes (need-replication), m and n pass
      through.

    Factors are numbered lhs dims first, then rhs's, then the group dim, like Shardy's printout.
    """
    dn = params["ragged_dot_dimension_numbers"]
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    lragged, rgroup = tuple(dn.lhs_ragged_dimensions), tuple(dn.rhs_group_dimensions)
    x, w, gs = ins
    (y,) = outs
    expect(len(lragged) == 1 and len(lc) == len(rc) and len(lb) == len(rb))
    ragged = lragged[0]
    expect(ragged not in lb)  # ragged batch dims: no rule yet
    contracting_mode = ragged in lc
    expect(len(rgroup) == (0 if contracting_mode else 1))
    g = gs[-1]
    expect(len(gs) == len(lb) + 1)  # group_sizes: [*batch, g]
    lfree = [d for d in range(len(x)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(w)) if d not in rc and d not in rb and d not in rgroup]
    lead = 1 if contracting_mode else 0  # the result's leading group dim
    expect(len(y) == lead + len(lb) + len(lfree) + len(rfree))
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(x):
        if d in lb:
            k = lb.index(d)
            expect(w[rb[k]] == n == y[lead + k] == gs[k])
            b.factor(n, operands={0: d, 1: rb[k], 2: k}, results={0: lead + k})
        elif d in lc:
            r = rc[lc.index(d)]
            expect(w[r] == n)
            b.factor(n, NEED_REPLICATION if d == ragged else REDUCTION, operands={0: d, 1: r})
        else:
            o = lead + len(lb) + lfree.index(d)
            expect(y[o] == n)
            b.factor(n, NEED_REPLICATION if d == ragged else PASS_THROUGH,
                     operands={0: d}, results={0: o})
    for k, d in enumerate(rfree):
        o = lead + len(lb) + len(lfree) + k
        expect(y[o] == w[d])
        b.factor(w[d], operands={1: d}, results={0: o})
    if contracting_mode:
        expect(y[0] == g)
        b.factor(g, NEED_REPLICATION, operands={2: len(gs) - 1}, results={0: 0})
    else:
        expect(w[rgroup[0]] == g)
        b.factor(g, NEED_REPLICATION, operands={1: rgroup[0], 2: len(gs) - 1})
    return b.build()


@register("conv_general_dilated")
@guarded
def conv_general_dilated_rule(ins, outs, params):
    """Convolution, following Shardy's factorization of the feature and batch dims.

    - batch: pass-through (lhs batch <-> out batch).
    - input feature: reduction (lhs feature <-> rhs in-feature; partial sums).
    - output feature: pass-through (rhs out-feature <-> out feature).
    - feature_group_count G > 1 (grouped and depthwise convs): the lhs feature dim is
      [G, C/G] and the rhs and out feature dims [G, O/G], the group factor G major and
      pass-through -- a depthwise conv shards its channels for free. batch_group_count B > 1
      (the kernel gradient of a grouped conv) does the same with the lhs batch dim [B, N/B].
    - spatial: the lhs and out spatial dims need replication (halo exchange) unless the window is
      1 with stride 1, no padding and no dilation, when they pass through; they are tied when
      equal in size (SAME padding, stride 1). The kernel spatial dims need replication too:
      plan.jit reads the lhs window dims whole (a multi-axis mesh's windowed partial sums are
      miscompiled, see tests/test_property.py), and from a whole lhs XLA's conv partitioner
      gathers the rhs window dims rather than summing partial windows (jax 0.10.2: the kernel
      gradient of a conv with its output's width sharded all-gathers the output gradient).
    """
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    x, w = ins[0], ins[1]
    y = outs[0]
    fgc = params.get("feature_group_count", 1)
    bgc = params.get("batch_group_count", 1)
    lb, lf, lsp = lhs_spec[0], lhs_spec[1], lhs_spec[2:]
    ro, ri, rsp = rhs_spec[0], rhs_spec[1], rhs_spec[2:]
    ob, of, osp = out_spec[0], out_spec[1], out_spec[2:]
    expect(len(lsp) == len(rsp) == len(osp))
    expect(x[lf] == w[ri] * fgc and x[lb] == y[ob] * bgc and w[ro] == y[of])
    expect(w[ro] % (fgc * bgc) == 0)
    b = RuleBuilder(ins, outs)
    if bgc > 1:
        b.factor(bgc, operands={0: lb, 1: ro}, results={0: of})
    b.factor(y[ob], operands={0: lb}, results={0: ob})
    if fgc > 1:
        b.factor(fgc, operands={0: lf, 1: ro}, results={0: of})
    b.factor(w[ri], REDUCTION, operands={0: lf, 1: ri})
    b.factor(w[ro] // (fgc * bgc), operands={1: ro}, results={0: of})
    strides = params.get("window_strides") or (1,) * len(lsp)
    padding = params.get("padding") or ((0, 0),) * len(lsp)
    lhs_dil = params.get("lhs_dilation") or (1,) * len(lsp)
    for s, (ls, rs, os_) in enumerate(zip(lsp, rsp, osp)):
        trivial = (w[rs] == 1 and strides[s] == 1 and tuple(padding[s]) == (0, 0)
                   and lhs_dil[s] == 1)
        if trivial:
            expect(x[ls] == y[os_])
            b.factor(x[ls], operands={0: ls}, results={0: os_})
        else:
            resized_dim(b, x[ls], y[os_], operands=(0,), results=(0,), in_dim=ls, out_dim=os_)
        b.factor(w[rs], NEED_REPLICATION, operands={1: rs})
    return b.build()


def batched_matrix_rule(ins, outs, batch_dims, pairs=()):
    """Leading `batch_dims` dims shared by every tensor pass through; every other dim needs
    replication (a decomposition or solve needs its matrices whole). `pairs` lists
    (operand, result) whose trailing dims correspond (cholesky's input and factor): those are
    tied, still need-replication, where their sizes agree."""
    batch = ins[0][:batch_dims]
    for s in (*ins, *outs):
        expect(len(s) >= batch_dims and s[:batch_dims] == batch)
    b = RuleBuilder(ins, outs)
    tie_same_shape(b, batch, operands=range(len(ins)), results=range(len(outs)))
    paired_in, paired_out = set(), set()
    for i, j in pairs:
        expect(len(ins[i]) == len(outs[j]))
        paired_in.add(i)
        paired_out.add(j)
        for d in range(batch_dims, len(ins[i])):
            resized_dim(b, ins[i][d], outs[j][d], operands=(i,), results=(j,), in_dim=d, out_dim=d)
    for i, s in enumerate(ins):
        if i not in paired_in:
            for d in range(batch_dims, len(s)):
                b.factor(s[d], NEED_REPLICATION, operands={i: d})
    for j, s in enumerate(outs):
        if j not in paired_out:
            for d in range(batch_dims, len(s)):
                b.factor(s[d], NEED_REPLICATION, results={j: d})
    return b.build()


def _matrix(pairs=(), vector_operand=False):
    """A rule for an op on [..., m, n] matrices; batch dims from operand 0's rank (or rank - 1
    when operand 0 is a batch of vectors)."""

    @guarded
    def rule(ins, outs, params):
        nb = len(ins[0]) - (1 if vector_operand else 2)
        expect(nb >= 0)
        return batched_matrix_rule(ins, outs, nb, pairs)

    return rule


# input and factor have the same shape and rows/cols: tie them (still need-replication)
register("cholesky", "cholesky_update", "lu", "hessenberg", "tridiagonal",
         "householder_product")(_matrix(pairs=((0, 0),)))
register("qr", "eigh", "eig", "svd", "schur")(_matrix())
# triangular_solve(a, b) -> x: x has b's shape. symmetric_product(a, c) -> c'. ormqr(a, taus, c)
register("triangular_solve", "symmetric_product")(_matrix(pairs=((1, 0),)))
register("ormqr")(_matrix(pairs=((2, 0),)))
# tridiagonal_solve(dl, d, du, b) -> x: the diagonals are [..., m], b and x [..., m, n]
register("tridiagonal_solve")(_matrix(pairs=((3, 0),), vector_operand=True))
register("lu_pivots_to_permutation")(_matrix(vector_operand=True))


@register("fft")
@guarded
def fft_rule(ins, outs, params):
    """The transformed (trailing) dims need replication; the leading dims are a batch.
    A transformed dim that keeps its size is tied to itself (real <-> complex halves do not)."""
    nb = len(ins[0]) - len(params["fft_lengths"])
    expect(nb >= 0)
    return batched_matrix_rule(ins, outs, nb, pairs=((0, 0),))
