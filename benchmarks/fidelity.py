"""How close the cost model comes to what XLA compiled: estimate ÷ measured, per figure.

    python benchmarks/fidelity.py [--models gpt mlp ...] [--random 3] [--held-out]

For every zoo model (tiny sizes) and twenty third-party steps (flax.nnx and equinox MLPs, the
held-out models of tests/ext_models.py; two steps each in flax.linen, flax.nnx, equinox, haiku
and Keras 3, and a flax.linen step accumulating gradients, tests/third_party/models.py;
causal language models from Hugging Face, flax.nnx, penzai and Keras-Hub, a Mixtral MoE among
them, tests/third_party/hf.py and lms.py, which need the 'fidelity' extra) x the
expert strategies x a few random plans, on 8 simulated
CPU devices (mesh data=4 x model=2): estimate with tl.estimate, compile and run with tl.verify,
and compare per device: argument bytes, output bytes, temporaries, peak (argument + output +
temporaries − aliased, the way both count it), flops, and collective bytes by kind. Prints one
row per plan and then the median and worst ratio per figure. --held-out measures steps kept
aside instead: the language models and Hugging Face's BERT at twice the batch, sequence and
width, expert plans only.

Known differences, reported rather than tuned away:
- XLA:CPU emits a reduce-scatter as an all-reduce of the whole buffer (GPU and TPU do not), so
  "all-reduce" below compares the model's all-reduce + reduce-scatter bytes with XLA's
  all-reduce bytes.
- The collective-permutes the model predicts: a shard_map body's ppermutes (a ring shift,
  once per scan step: tests/test_cost_manual.py); a dim handed from its axes to others
  (P("data") to P("model"): the shard permuted, then all-gathered over part of the old axes
  where they have more ways; gpt maxtext's layer-norm parameters and position table,
  collective-permute 0.00 -> 0.92); and a matmul reduced onto its result's axes while
  replicated over axes of a multiple of their ways, which XLA slices over those, all-reduces
  as a shard and permutes into place instead of reduce-scattering (gpt random1's value
  projection: collective-permute 0.00 -> 1.00, all-reduce 1.11 -> 1.00); an FSDP embedding
  gradient's tokens regrouped after operand passthrough (the tokens' shard permuted and
  all-gathered over part of data, then each group's table all-reduced over model or its rows
  split there: every fsdp+tp, zero1+tp and maxtext row of the transformers, collective-permute
  0.00 -> 1.00 and all-reduce 0.96-0.98 -> 1.00); sequence parallelism's labels, token
  gradients and picks permuted around the re-tiled loss (gpt, gpt_scan, llama fsdp+tp+sp:
  three of 128 B, 0.00 -> 1.00); a gather of rows sliced over the axes its result's features
  hold, all-reduced as a slice and moved to its tile, never reduce-scattered (gnn fsdp+tp:
  collective-permute 0.00 -> 1.00, all-reduce 1.28 -> 1.00); and a reshard that
  leaves a dim's axes out of the plan's order: XLA only subdivides a dim's tiles, so the axes
  a reshard brings land minor to those the dim keeps, the locally sliced before those an
  all-to-all brings, and where the plan lists them otherwise a permute of the shard (pairs
  (0,0),(1,2),(2,4),...: the transpose of data=4 x model=2) puts the tiles in order. A
  compound dim's axes tile its parts major first (tokens [32] on (data, model) split into 4
  micro-batches: data tiles the micro-batches, model the examples), and a class's axes keep
  the plan's order (("model", "data")): linen-accumulate dp, fsdp, zero1 0.00 -> 1.00 (the
  labels: an all-to-all over data, not over both axes, and the permute), equinox-attention
  random0 0.00 -> 1.00, random1 0.40 -> 0.60, haiku-transformer random1 0.00 -> 0.91; an
  all-gather of a dim's major axis that keeps a minor one, which XLA permutes into kept-first
  order before it gathers (equinox-attention random1's value projection on (model, data)
  read as heads on data: 0.60 -> 0.80); a reshape's merged dim tiled major first, and a
  reshard that only splits dims finer sliced and permuted, not moved by all-to-all; and a
  convolution's halo exchanges where its result shards a windowed dim (the rows a window needs
  from each neighbour's shard, one permute per side and hop, forward and input gradient, on
  top of the input plan.jit gathers: haiku-resnet random0 0.00 -> 0.83, random1 0.00 -> 0.89,
  nnx-cnn random0 0.00 -> 0.53, random1 0.00 -> 0.60, keras-cnn random1 0.00 -> 1.00, their
  convolutions' permutes exact but for one of haiku-resnet random0's input gradients, whose
  contracted features both operands shard over data x model: XLA gathers them and exchanges
  halos of a 2x2 input, 4 permutes of 4 KiB, where the model has the contraction
  partitioned). Axes one all-to-all moves from one dim keep that dim's order (a width on
  (data, model) moved to channels the plan lists (model, data): the pooling gradient's pad
  and a kernel gradient's input), a value read by several ops is put in order once, with
  its reshard, and a reduction whose read plan.jit pins sliced like its result (a bias
  gradient, from the compute domain to the parameters') gets its summed axes after that
  slice (features on (model, data) from a batch on model: a permute of the bias's shard):
  nnx-cnn random0 0.53 -> 1.00, haiku-resnet random1 0.89 -> 1.00, cnn random1 0.00 ->
  1.00 (six 8-16 B permutes of its bias gradients). An operand whose axes move between dims
  while every dim's tiles divide (or, partially replicated, multiply) what it had is
  resharded without an all-to-all: a permute of the shard onto the compatible sharding, then
  all-gathers dim by dim, the last first (or a local slice and a permute of the new shard;
  spmd_partitioner.cc's ReshardToPartialReplicateWithAllGather and
  ReshardFromPartialReplicateWithDynamicSlice): moe maxtext's expert weights, experts on model
  read as their hidden dim on model, collective-permute 0.02 -> 1.00, all-to-all 2.41 ->
  0.53, peak 1.15 -> 0.97. Explicitly batched gathers and scatters are re-tiled whatever the
  picks per position (moe fsdp+tp+sp's top-2 router: 0.27 -> 1.00). plan.jit pins both
  sides of a reshape or concatenate the plan slices locally at: llama random1's rotate-half,
  which XLA had carried back into the halves and cut as windows (8 permutes), now compiles
  none, as the plan says; haiku-transformer random0's queries, which XLA's propagation had
  sharded on heads (all-to-all 0.40 -> 1.00, all-gather 0.80 -> 1.00, all-reduce 1.13 ->
  1.00), but equinox-attention random1 flops 1.00 -> 1.10 (XLA splits more of its
  elementwise work than the plan says). "XLA
  other" is what XLA runs that no column compares (a collective-broadcast). The all-to-alls the model predicts: those
  XLA's scatter partitioner picks for a scatter contested on one axis (an FSDP embedding
  gradient); the re-tiling of the logits around a take_along_axis whose labels shard the
  sequence while the logits' vocabulary holds that axis (sequence parallelism's loss, and
  its gradient: XLA runs it over part of an axis, the model over the whole); a segment sum
  whose messages outweigh its sums (the GNN: Shardy shards the scatter like the messages and
  its sums move after it); and a scan's parameter stacks whose slices take the stack's axes
  on another dim. It misses XLA's own choices for MoE dispatch matmuls (moe fsdp+tp+sp's
  all-to-alls at a div and the dispatch dots; moe maxtext, where XLA moves the dispatched
  activations twice, at the dot and again at the plan's constraint, the model once), for a
  dynamic slice of a layer-sharded stack, for a backward matmul whose operand leaves an axis
  its result holds on another dim (haiku-transformer random0, collective-permute 0.67: XLA
  permutes the operand's rows onto free axes of more ways and gathers there, 7200 B; the
  model gathers over the axis), and
  XLA's resharding around an average pool (nnx-cnn random1, 1.9x; and 4.2x its permute
  bytes: XLA's propagation carries the bias gradient's pinned read back into the unpinned
  forward add, so the pool's input is gathered whole and sliced, no permute, where the model
  slices data, moves model and permutes as the plan says; with every value pinned,
  constraints="all", XLA's permutes are the model's exactly). A
  reshard that would both gather and move axes of a value the step already gathered whole
  is a local slice of that copy, as XLA's partitioner takes it from its reshard cache
  (gpt_scan random0: the tied embedding table, gathered for the logits, sliced for the
  input gradient).
- All-gathers are modelled where XLA puts them: once per value and sharding (a kernel read
  forward and, through `rev`, by its input gradient is gathered once; the reversed copy is
  a buffer of its own), a parameter stack
  sharded on a scan's scanned dim gathered whole before each loop, and the smaller of a
  segment sum's messages and sums moved. A reshard that both gathers some axes and moves
  others gathers first and moves the gathered buffer (P("data", "model") to P(None, None,
  "model"): an all-gather over data, then an all-to-all of 4 shards' worth), and where an
  axis leaves a dim together with one that moves to another dim (P(("data", "model")) to
  P(None, "model"), attention heads merged back by a reshape) XLA cannot split the reshard
  and all-gathers the operand whole ("involuntary full rematerialization"; equinox-attention
  random0 all-to-all 2.00 -> 1.00, haiku-transformer random0 all-gather 0.73 -> 0.80, random1
  all-to-all 0.73 -> 0.82). A compound dim's axes are split between its parts (above):
  [8, 15, 32] on (data, model) read with the heads whole and the head dim on model is an
  all-gather over data alone (haiku-transformer random0, whose all-to-all 1.20 -> 0.40: the
  model's all-to-all over model there had matched, at the wrong op, the one XLA runs for an
  attention matmul's operand in the backward, which the model misses). Still missed: XLA's
  sub-axes, where a compound dim's leading axes do not make up its major part exactly
  (tokens on (model, data) split into 4 micro-batches: XLA splits data 2 x 2 and permutes
  after an all-to-all over half of it; the model moves both axes); a class sharded over
  several axes out of mesh order (("model", "data")) where XLA gathers what the plan slices
  before a reduce-scatter (mlp and equinox random1); values
  of random plans whose classes collide on one axis (several classes of one value on
  "model", some over both axes), where XLA gathers activations and resliced parameters more
  often than the model's one reshard per read, not yet traced to a rule (gpt_scan random0,
  cnn random1, keras-transformer and equinox-attention random1: 0.29-0.43 of XLA's bytes); XLA's own propagation moving a
  gather upstream of a pooling, where it gathers the pool's input (4x the bytes of its
  result) rather than the result the next convolution reads (cnn random0, keras-cnn random0,
  nnx-cnn random1): a choice of sharding propagation, not of XLA:CPU alone. A reshape the plan
  gathers at is pinned by plan.jit: unpinned, XLA carried a GQA reshape of heads sharded
  over more devices than there are kv heads on sub-axes and gathered piecemeal (llama
  megatron: 0.15 of its all-gather bytes before the pin, exact after); so is the operand of a
  reshape the plan slices at, which XLA otherwise computed sharded on sub-axes of the split
  dims (a group norm under Megatron: 0.73 of the plan's flops, and its input gradient gathered
  again for the convolution before it: all-gather 0.49 of XLA's before, exact after).
- Temporaries depend on XLA's schedule, fusion and buffer assignment, which the model
  approximates by liveness over the order XLA:CPU runs the ops (its breadth-first
  BFSMemoryScheduler, which it takes for every module with collectives: a reshard, a weight's
  transpose, the max-pool gradient's window indices run as soon as their operands exist),
  with elementwise producers fused into their readers except the inputs its YNNPACK
  reductions read from memory (x - mean and the normalised x of a large layer norm) and
  expensive ops read by several fusions, a loop's state and a cond's results held once
  (colocated with their bodies' parameters and roots), XLA:CPU's single combined gradient
  all-reduce (partial sums live until it, results written there), its max-pool-gradient
  expansion, a loop body's temporaries within their iteration, the residual stacks a
  forward scan keeps for the backward one sharded like the slices it writes, the scanned dim
  whole (gpt_scan random1 peak 1.62 -> 0.98; llama random0 0.91 -> 1.13, its residuals
  exact, an overcount elsewhere no longer offset), temporaries placed in output buffers not
  yet written, and a temporary a dot reads as a local slice sliced as soon as it is made (a
  ZeRO-1 weight gradient's slice of a forward activation kept for the backward pass, not the
  activation: gnn zero1 1.46 -> 1.04). Still missed: a value gathered whole for a forward dot
  whose weight gradient wants it sliced on the same dim over another axis (gnn maxtext:
  h[senders] on model gathered, then wanted on data): XLA moves the shard with a
  collective-permute as soon as it is made and frees the gathered copy after the forward
  pass, the model keeps the gathered copy until the backward (1.56); the stack of a constant
  XLA keeps among a scan's residuals (gpt_scan's and llama's causal mask, pred[L, ...]), and
  odd shardings of a max pool (cnn random1).
- XLA's cost_analysis() counts a while loop's body once; the model's `flops` counts a scan body
  once per iteration, which is what runs, so the table compares its flops_loop_bodies_once.
- The estimate runs on a "cpu" mesh: the model of XLA:CPU's passes (no all-reduce
  reassociation, no fused attention, cheap elementwise ops cloned into every fusion that
  reads them, each clone's flops counted; top_k, a TopK custom call the SPMD partitioner
  cannot split, computed whole after all-gathering its operand), since XLA:CPU compiled what
  is measured.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import statistics  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import toast_lab as tl  # noqa: E402
from toast_lab import random_plan  # noqa: E402
from toast_lab.verification import summarize_collectives, verify  # noqa: E402

FIGURES = ("argument", "output", "temp", "peak", "flops", "all-reduce", "all-gather",
           "all-to-all", "collective-permute")


def _collective_bytes(pairs) -> dict:
    out = {"all-reduce": 0.0, "all-gather": 0.0, "all-to-all": 0.0, "collective-permute": 0.0,
           "other": 0.0}
    for kind, nbytes in pairs:
        kind = "all-reduce" if kind == "reduce-scatter" else kind
        out[kind if kind in out else "other"] += nbytes
    return out


def compare(fn, sample, an, plan, mesh) -> dict:
    est = tl.estimate(an, plan, mesh)
    rep = verify(fn, sample, plan, mesh)
    st = rep.stats
    measured = summarize_collectives(st.collectives)
    mc = _collective_bytes((k, v.bytes) for (k, _), v in measured.items())
    ec = _collective_bytes((k, c.bytes) for (k, _), c in est.collectives.items())
    pairs = {
        "argument": (est.argument_bytes, st.argument_bytes),
        "output": (est.output_bytes, st.output_bytes),
        "temp": (est.temp_bytes, st.temp_bytes),
        "peak": (est.peak_memory_bytes, st.peak_bytes),
        # XLA's cost_analysis counts a while loop's body once: so does this figure
        "flops": (est.flops_loop_bodies_once, st.flops),
    }
    for kind in ("all-reduce", "all-gather", "all-to-all", "collective-permute"):
        pairs[kind] = (ec[kind], mc[kind])
    return {"pairs": pairs, "other": mc["other"], "ok": rep.ok}


# Training steps written with other libraries: flax.nnx and equinox MLPs (tests/ext_models.py),
# and two steps per library the way its docs write them (tests/third_party/models.py): flax.linen
# (scan + remat, an embedding; a ViT; a decoder accumulating gradients over micro-batches in a
# scan), flax.nnx (batch norm, dropout; the MNIST tutorial's CNN),
# equinox (filtered; attention blocks), haiku (a ResNet with batch norm; a causal decoder) and
# Keras 3 (attention, exact GELU; a CNN with batch norm, max pooling and dropout).
EXTERNAL = ("nnx", "equinox")
THIRD_PARTY = {"linen": "linen", "nnx-bn-dropout": "nnx", "equinox-filter": "equinox",
               "haiku-resnet": "haiku", "keras-transformer": "keras", "nnx-cnn": "nnx-cnn",
               "haiku-transformer": "haiku-transformer",
               "equinox-attention": "equinox-attention", "linen-vit": "linen-vit",
               "keras-cnn": "keras-cnn", "linen-accumulate": "linen-accumulate"}
# Causal language models built from their libraries' own layers (tests/third_party/hf.py and
# lms.py), at a size (1: batch 8, sequence 16, width 32).
LANGUAGE_MODELS = ("hf-gpt2", "hf-llama", "nnx-transformer", "penzai-llama", "keras-hub-gpt2",
                   "keras-hub-llama", "keras-hub-mixtral")
HELD_OUT = LANGUAGE_MODELS + ("hf-bert",)
HELD_OUT_SIZE = 2


def _repository_on_path() -> None:
    """The third-party steps live in the repository's tests/ package."""
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)


def _model(name: str, size: int = 1):
    """(step, abstract args, concrete sample) of a zoo model or a third-party step (a language
    model at `size`)."""
    if name in EXTERNAL or name in THIRD_PARTY or name in HELD_OUT:
        _repository_on_path()
    if name in HELD_OUT:
        from tests.third_party import hf, lms

        build = {**hf.BUILDERS, **lms.BUILDERS}[name]
        fn, sample = build(size)
        fargs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), sample)
        return fn, fargs, sample
    if name in EXTERNAL:
        from tests import ext_models

        build, sample = {"nnx": (ext_models.nnx_train_step, ext_models.nnx_sample),
                         "equinox": (ext_models.equinox_train_step,
                                     ext_models.equinox_sample)}[name]
        fn, fargs = build()
        return fn, fargs, sample()
    if name in THIRD_PARTY:
        from tests.third_party.models import BUILDERS

        fn, sample = BUILDERS[THIRD_PARTY[name]][0]()
        fargs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), sample)
        return fn, fargs, sample
    fn, fargs = tl.zoo.get(name)
    return fn, fargs, tl.zoo.sample(name)


def ratio(e: float, m: float) -> float | None:
    if m == 0 and e == 0:
        return None  # neither has it: nothing to compare
    if m == 0:
        return float("inf")
    return e / m


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+",
                        default=list(tl.zoo.names()) + list(EXTERNAL) + list(THIRD_PARTY)
                        + list(LANGUAGE_MODELS),
                        help="zoo models, and the third-party steps "
                        + ", ".join(EXTERNAL + tuple(THIRD_PARTY) + LANGUAGE_MODELS))
    parser.add_argument("--random", type=int, default=2, help="random plans per model")
    parser.add_argument("--held-out", action="store_true",
                        help=f"the held-out steps instead ({', '.join(HELD_OUT)} at size "
                        f"{HELD_OUT_SIZE}), expert plans only")
    args = parser.parse_args()
    size = 1
    if args.held_out:
        args.models, args.random, size = list(HELD_OUT), 0, HELD_OUT_SIZE
    # The devices XLA compiles for here are CPUs: the estimate follows XLA:CPU's passes (no
    # all-reduce reassociation, attention unfused) so that like is compared with like.
    mesh = tl.Mesh({"data": 4, "model": 2}, device="cpu")
    print("estimate ÷ measured per device (— where neither has any); mesh data=4 x model=2\n")
    print("| model | plan | numerics | " + " | ".join(FIGURES) + " | XLA other (B) |")
    print("|---|---|---|" + "---:|" * (len(FIGURES) + 1))
    ratios: dict[str, list[float]] = {f: [] for f in FIGURES}
    for name in args.models:
        fn, fargs, sample = _model(name, size)
        an = tl.analyze(tl.trace(fn, *fargs))
        plans = dict(tl.strategies.expert(an, mesh))
        rng = np.random.default_rng(0)
        for k in range(args.random):
            plans[f"random{k}"] = random_plan(an, mesh, rng)
        for pname, plan in plans.items():
            row = compare(fn, sample, an, plan, mesh)
            cells = []
            for f in FIGURES:
                r = ratio(*row["pairs"][f])
                if r is not None:  # one side only (∞, 0) counts, as a miss
                    ratios[f].append(r)
                cells.append("—" if r is None else "∞" if not np.isfinite(r) else f"{r:.2f}")
            print(f"| {name} | {pname} | {'ok' if row['ok'] else 'MISMATCH'} | "
                  + " | ".join(cells) + f" | {row['other']:,.0f} |", flush=True)
    print("\n| figure | plans | median | worst | within goal |")
    print("|---|---:|---:|---:|---:|")
    goals = {"argument": 0.0, "output": 0.0, "flops": 0.10, "peak": 0.20, "all-reduce": 0.25,
             "all-gather": 0.25, "all-to-all": 0.25, "collective-permute": 0.25, "temp": None}
    for f in FIGURES:
        rs = ratios[f]
        if not rs:
            print(f"| {f} | 0 | — | — | — |")
            continue
        worst = max(rs, key=lambda r: abs(np.log(r)) if 0 < r < np.inf else np.inf)
        goal = goals[f]
        within = "—" if goal is None else \
            f"{sum(abs(r - 1) <= goal + 1e-9 for r in rs)}/{len(rs)}"
        print(f"| {f} | {len(rs)} | {statistics.median(rs):.3f} | {worst:.3f} | {within} |")


if __name__ == "__main__":
    main()
