"""Rules for cuDNN's fused attention: what `jax.nn.dot_product_attention(...,
implementation="cudnn")` traces to on a GPU (jax/_src/cudnn/fused_attention_stablehlo.py).

The forward takes q [*B, T, N, H], k and v [*B, S, K, H] (layout BTNH; BNTH puts the heads
before the sequence), then bias, sequence lengths, offsets and page tables (empty [0] arrays
when unused), and gives the output like q and, when training, the softmax statistics
[*B, N, T]. The backward takes the same ten operands, the statistics, the forward output and its
cotangent, and gives dq, dk, dv (and dbias with a bias).

JAX's own partitioning of these custom calls (`_check_qkv_bias_mask_spec`) shards only the
batch dims and the heads, the same way on q, k and v; a sharded sequence or head dim is an
error there. So: batch dims pass through, the key/value heads pass through q's heads (with
grouped-query attention q's heads are K groups of N / K: the groups are the major factor, the
heads within a group need replication), and the sequence and head dims need replication.
"""

from __future__ import annotations

from ._core import NEED_REPLICATION, PASS_THROUGH, RuleBuilder
from ._helpers import expect, guarded
from ._table import register

# (the wrappers are what jaxprs hold; they lower to the unwrapped primitives)
FORWARD = ("dot_product_attention_fwd_wrapper",)
BACKWARD = ("dot_product_attention_bwd_wrapper",)
# the operands after q, k, v that both directions take: bias, q_seqlen, kv_seqlen, q_offsets,
# kv_offsets, page_table_k, page_table_v
EXTRAS = 7


def qkv_axes(shape, params) -> tuple[int, int, int]:
    """(sequence, heads, head dim) positions in a q/k/v-shaped tensor of the op's layout."""
    layout = params.get("layout", 0)
    rank = len(shape)
    if int(getattr(layout, "value", layout)) == 1:  # BNTH
        return rank - 2, rank - 3, rank - 1
    return rank - 3, rank - 2, rank - 1  # BTNH


@register(*FORWARD, *BACKWARD)
@guarded
def cudnn_attention_rule(ins, outs, params):
    q, k, v = ins[0], ins[1], ins[2]
    expect(len(q) >= 3 and len(k) == len(q) and len(v) == len(q))
    t_ax, n_ax, h_ax = qkv_axes(q, params)
    batch = len(q) - 3
    expect(q[:batch] == k[:batch] == v[:batch] and k[t_ax] == v[t_ax] and k[n_ax] == v[n_ax])
    forward = len(outs) <= 2
    # tensors shaped like q (sequence T, heads N) and like k (sequence S, heads K), by side
    if forward:
        like_q = {"in": [0], "out": [0]}
        like_k = {"in": [1, 2], "out": []}
        stats = {"in": [], "out": [1] if len(outs) > 1 and outs[1] else []}
    else:
        like_q = {"in": [0, 3 + EXTRAS + 1, 3 + EXTRAS + 2], "out": [0]}
        like_k = {"in": [1, 2], "out": [1, 2]}
        stats = {"in": [3 + EXTRAS], "out": []}
    for group in (like_q, like_k):
        for side in ("in", "out"):
            shapes = ins if side == "in" else outs
            group[side] = [i for i in group[side] if i < len(shapes) and len(shapes[i]) == len(q)]
    for i in stats["in"]:
        expect(i < len(ins) and len(ins[i]) == batch + 2)
    b = RuleBuilder(ins, outs)

    def tie(groups, axis, size, kind, stats_axis=None):
        operands = {i: axis for g in groups for i in g["in"]}
        results = {j: axis for g in groups for j in g["out"]}
        if stats_axis is not None:
            operands.update({i: stats_axis for i in stats["in"]})
            results.update({j: stats_axis for j in stats["out"]})
        b.factor(size, kind, operands=operands, results=results)

    for d in range(batch):
        tie((like_q, like_k), d, q[d], PASS_THROUGH, stats_axis=d)
    heads, kv_heads = q[n_ax], k[n_ax]
    expect(kv_heads >= 1 and heads % kv_heads == 0)
    # the heads: K groups shared by q and k/v, then q's heads within a group
    tie((like_q, like_k), n_ax, kv_heads, PASS_THROUGH, stats_axis=batch)
    tie((like_q,), n_ax, heads // kv_heads, NEED_REPLICATION, stats_axis=batch)
    tie((like_q,), t_ax, q[t_ax], NEED_REPLICATION, stats_axis=batch + 1)
    tie((like_k,), t_ax, k[t_ax], NEED_REPLICATION)
    tie((like_q, like_k), h_ax, q[h_ax], NEED_REPLICATION)
    # bias, lengths, offsets, page tables: each dim whole (a bias's batch and heads could
    # follow q's; cuDNN's bias is rare in training steps, and whole is always valid)
    for i in range(3, min(3 + EXTRAS, len(ins))):
        for d, n in enumerate(ins[i]):
            b.factor(n, NEED_REPLICATION, operands={i: d})
    if not forward:
        for j in range(3, len(outs)):
            for d, n in enumerate(outs[j]):
                b.factor(n, NEED_REPLICATION, results={j: d})
    return b.build()


def is_causal(params) -> bool:
    """Whether the kernel skips the masked half (MaskType CAUSAL or PADDING_CAUSAL)."""
    mask = params.get("mask_type")
    return "CAUSAL" in str(getattr(mask, "name", mask)).upper()
