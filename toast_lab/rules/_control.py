"""Rules for region primitives: scan, while, cond.

Their bodies stay in the program as regions analysed once; these rules tie each outer operand
and result to the body's inputs and outputs (the `body` tensors, laid out by _trace.py), so a
loop-carried dimension is one factor across iterations and a scanned stack of layers is one
set of decisions, not one per layer.
"""

from __future__ import annotations

from ._core import NEED_REPLICATION, PASS_THROUGH, RuleBuilder
from ._table import register


def _tie(b: RuleBuilder, shape, operands=None, results=None, body=None, kind=PASS_THROUGH):
    """One factor per dim of `shape`, mapped to the same dim of every listed tensor."""
    for d, n in enumerate(shape):
        b.factor(n, kind,
                 operands={t: d for t in operands or ()},
                 results={t: d for t in results or ()},
                 body={t: d for t in body or ()})


@register("scan")
def scan_rule(ins, outs, params, body):
    # operands: consts, carry init, xs     results: carry final, ys
    # body:     [consts, carry, x slices] (the body's inputs) + [carry out, y slices] (outputs)
    nc, nk = params["num_consts"], params["num_carry"]
    n_body_in = len(ins)
    b = RuleBuilder(ins, outs, body)
    for i in range(nc):
        _tie(b, ins[i], operands=[i], body=[i])
    for j in range(nk):
        _tie(b, ins[nc + j], operands=[nc + j], results=[j], body=[nc + j, n_body_in + j])
    # The scanned dim: each iteration touches one slice, so the loop needs it whole (or pays a
    # gather per iteration). Sharding it is pipeline-like; it gets its own decision.
    xs = range(nc + nk, len(ins))
    ys = range(nk, len(outs))
    b.factor(params["length"], NEED_REPLICATION,
             operands={i: 0 for i in xs}, results={j: 0 for j in ys})
    for i in xs:
        for d, n in enumerate(ins[i][1:]):
            b.factor(n, operands={i: d + 1}, body={i: d})
    for j in ys:
        for d, n in enumerate(outs[j][1:]):
            b.factor(n, results={j: d + 1}, body={n_body_in + j: d})
    return b.build()


@register("while")
def while_rule(ins, outs, params, body):
    # operands: cond consts, body consts, carry init      results: carry
    # body: cond inputs [cond consts, carry] + body inputs [body consts, carry] + body outputs
    cc, bc = params["cond_nconsts"], params["body_nconsts"]
    n = len(outs)
    b = RuleBuilder(ins, outs, body)
    for i in range(cc):
        _tie(b, ins[i], operands=[i], body=[i])
    for i in range(bc):
        _tie(b, ins[cc + i], operands=[cc + i], body=[cc + n + i])
    for j in range(n):
        _tie(b, outs[j], operands=[cc + bc + j], results=[j],
             body=[cc + j, cc + n + bc + j, cc + n + bc + n + j])
    return b.build()


@register("cond")
def cond_rule(ins, outs, params, body):
    # operands: branch index, then the branch operands      results: the branch results
    # body: for each branch, its inputs then its outputs
    ops, m = len(ins) - 1, len(outs)
    per_branch = ops + m
    branches = range(len(params["branches"]))
    b = RuleBuilder(ins, outs, body)
    for i in range(ops):
        _tie(b, ins[1 + i], operands=[1 + i], body=[k * per_branch + i for k in branches])
    for j in range(m):
        _tie(b, outs[j], results=[j], body=[k * per_branch + ops + j for k in branches])
    return b.build()
