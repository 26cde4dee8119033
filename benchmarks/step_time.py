"""Estimated step time, exposed communication, MFU and peak memory of public training recipes.

    python benchmarks/step_time.py [--only llama2-7b-h100x8 ...] [--search SECONDS]
        [--without-remat SECONDS] [--held-out SECONDS] [--pipelined]

Each row traces a zoo model at full size (abstract arguments: nothing is allocated) with the
shapes and parallelism of a public recipe, named in the table below, and estimates one
training step per device with tl.estimate (donated state, collectives scheduled). The
figures are the model's; nothing here is fitted to published step times (the cost model's
constants come from device measurements and datasheets, see toast_lab/plan/_hardware.py).

MFU = model flops per step / (step time x devices x peak bf16 FLOP/s), model flops by PaLM's
count (Chowdhery et al. 2022, appendix B): 6 N + 12 L H Q T per token, N the parameters, L
layers, H heads, Q head size, T sequence length (recomputation not counted).
--search S also runs tl.search for S seconds around the recipe's batch sharding and reports
its plan's step time under the same model.

--without-remat S traces each recipe as a user first writes it, without jax.checkpoint, and
runs tl.search on it for S seconds (the recipe's batch sharding pinned): the search decides
remat per layer group and micro-batches along with the sharding. The table gives the smallest
peak of the expert strategies as written, the fastest expert plan that fits (a strategy
climbs its recipe's remat ladder where it does not fit as written: tl.strategies.expert), the
search's plan's decisions beyond sharding, its estimate, whether it fits, and its step time
over the recipe's own (published remat and sharding); the search should fit every recipe,
within 1.10x of the recipe's step.

--pipelined prints the recipes with pipeline stages (PIPELINED: Llama 3.1 405B as Meta and
torchtitan ran it): each as the expert strategy that names its parallelism, with the recipe's
schedule and micro-batches, its bubble, exposed communication, MFU and peak beside the
published figure; with --search S, what tl.search finds on the same mesh in S seconds.

--held-out S reports the published runs kept aside (HELD_OUT: never used to tune the cost
model or the search), each traced without jax.checkpoint and searched for S seconds around
its batch axes: the plan, whether it fits, and its estimated step time over the published
one (the aim: every run fits, within 1.25x either way).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

import toast_lab as tl


@dataclass(frozen=True)
class Recipe:
    """A public recipe: model config, mesh, and its parallelism as class -> mesh axes (in
    decision order: the batch first, so activations keep it where parameters want the same
    axis, as FSDP runs)."""

    name: str
    model: str
    config: dict
    mesh: dict
    device: str
    parallelism: str
    plan: dict
    source: str
    across_slices: tuple = ()  # mesh axes between slices, over the data-center network


def fsdp(*axes):
    """Batch over every axis, parameters' embed dim over the FSDP axes (ZeRO-3)."""
    return {"batch": axes, "embed": axes[-1:]}


RECIPES = (
    # (the H100 recipes run flash attention: cuDNN's kernel, traced as a GPU traces it)
    Recipe("llama2-7b-h100x8", "llama", dict(size="llama2-7b", batch=8, remat=True,
                                             attention="cudnn"),
           {"data": 8}, "h100", "FSDP", fsdp("data"),
           "Llama-2-7B, seq 4096, 1 sequence per GPU, FSDP over one 8xH100 node with full "
           "activation checkpointing (PyTorch FSDP / torchtitan recipes)"),
    Recipe("llama3.1-8b-h100x8", "llama", dict(size="llama3.1-8b", batch=8, remat=True,
                                                attention="cudnn"),
           {"data": 8}, "h100", "FSDP", fsdp("data"),
           "Llama-3.1-8B, seq 8192, local batch 1, FSDP on 8 H100s, full activation "
           "checkpointing (torchtitan llama3_8b.toml)"),
    Recipe("llama3.1-8b-h100x64", "llama", dict(size="llama3.1-8b", batch=64, remat=True,
                                                 attention="cudnn"),
           {"data": 64}, "h100", "FSDP", fsdp("data"),
           "the same on 8 nodes (64 H100s, one 400 Gb/s InfiniBand NIC per GPU), FSDP over all"),
    Recipe("llama2-7b-h100x256", "llama", dict(size="llama2-7b", batch=256, remat=True,
                                               attention="cudnn"),
           {"data": 256}, "h100", "FSDP", fsdp("data"),
           "Llama-2-7B on 32 nodes (256 H100s), FSDP over all, 1 sequence of 4096 per GPU"),
    Recipe("llama2-7b-v5p-128", "llama", dict(size="llama2-7b", batch=512, seq=2048,
                                              remat=True),
           {"data": 128}, "tpu-v5p", "FSDP", fsdp("data"),
           "MaxText llama2-7b on a v5p-128 slice: FSDP over 128 chips, per-device batch 4, "
           "seq 2048, full remat (MaxText v5p training configs)"),
    Recipe("llama2-7b-v5p-2x128", "llama", dict(size="llama2-7b", batch=1024, seq=2048,
                                                remat=True),
           {"slice": 2, "data": 128}, "tpu-v5p", "DP x FSDP", fsdp("slice", "data"),
           "the v5p-128 recipe on two slices over the data-center network (MaxText multislice: "
           "data parallel across slices, FSDP within)", across_slices=("slice",)),
    Recipe("llama2-7b-v5e-256", "llama", dict(size="llama2-7b", batch=256, seq=2048,
                                              remat=True),
           {"data": 256}, "tpu-v5e", "FSDP", fsdp("data"),
           "MaxText llama2-7b on a v5e-256 pod: FSDP over 256 chips, per-device batch 1, "
           "seq 2048 (MaxText v5e training configs)"),
    Recipe("llama3.1-8b-v6e-256", "llama", dict(size="llama3.1-8b", batch=256, remat=True),
           {"data": 256}, "tpu-v6e", "FSDP", fsdp("data"),
           "MaxText llama3.1-8b on a v6e-256 pod: FSDP over 256 chips, per-device batch 1, "
           "seq 8192 (MaxText Trillium recipes)"),
    Recipe("gpt3-175b-v5p-1024", "gpt_scan", dict(size="gpt3-175b", batch=2048, remat=True,
                                                  dtype="bfloat16"),
           {"data": 128, "model": 8}, "tpu-v5p", "FSDP x TP",
           {"batch": ("data",), "embed": ("data",), "heads": ("model",), "mlp": ("model",)},
           "MaxText gpt3-175b on v5p-1024: FSDP x tensor parallel (128 x 8), per-device batch "
           "2, seq 2048 (MaxText gpt3-175b config)"),
    Recipe("gpt2-xl-megatron-h100x8", "gpt", dict(size="gpt2-xl", batch=32, remat=True,
                                                   dtype="bfloat16"),
           {"data": 4, "model": 2}, "h100", "DP x TP",
           {"batch": ("data",), "heads": ("model",), "mlp": ("model",), "vocab": ("model",)},
           "Megatron-LM GPT (1.5B, 48 layers) on 8 H100s: tensor parallel 2 x data parallel 4, "
           "global batch 32, seq 1024, activation recomputation (Megatron-LM "
           "examples/pretrain_gpt.sh style; plain-JAX attention, costed unfused)"),
)


@dataclass(frozen=True)
class PipelinedRecipe:
    """A public recipe with pipeline stages: the expert strategy that names its parallelism
    (tl.strategies.expert on the recipe's mesh, whose "stage" axis holds the stages), with the
    recipe's schedule and micro-batch count. layers: the stack's layers as traced, where the
    recipe's own count does not divide over its stages (`note` says why)."""

    name: str
    model: str
    config: dict
    mesh: dict
    device: str
    strategy: str
    schedule: str
    chunks: int
    micro_batches: int
    published: str
    note: str
    source: str


PIPELINED = (
    PipelinedRecipe(
        "llama3.1-405b-h100x8192", "llama",
        dict(size="llama3.1-405b", layers=128, batch=2048, remat=True, attention="cudnn"),
        {"stage": 16, "data": 64, "model": 8}, "h100", "tp+pp+dp", "circular", 2, 32,
        "BF16 MFU 43% (430 TFLOP/s per GPU)",
        "128 layers: the SPMD pipeline stores the stack divided evenly over the stages; "
        "Meta's own pipeline gave the first and last of 16 stages one layer fewer of 126",
        "Llama 3.1 405B pre-training on 8,192 H100s: TP 8 x PP 16 x DP 64, seq 8192, 32 "
        "sequences per data-parallel group (16M tokens per step), an interleaved schedule, "
        "BF16 MFU 43% (Dubey et al., 'The Llama 3 Herd of Models', arXiv 2407.21783, table 4)"),
    PipelinedRecipe(
        "torchtitan-llama3.1-405b-h100x512", "llama",
        dict(size="llama3.1-405b", layers=128, batch=256, remat=True, attention="cudnn"),
        {"stage": 8, "data": 8, "model": 8}, "h100", "fsdp+tp+pp", "circular", 2, 32,
        "32.0 s (4,096 tokens per GPU at 128 per second, Float8 matmuls)",
        "128 layers, as above (torchtitan splits 126 over its 8 stages unevenly)",
        "torchtitan's Llama 3.1 405B on 512 H100s (96 GB): FSDP 8 x TP 8 x PP 8, seq 8192, local "
        "batch 32, global batch 256, full activation checkpointing, torch.compile, Float8 and "
        "async TP, Interleaved 1F1B: 128 tokens per second per GPU, 72.7 GiB (torchtitan "
        "benchmarks/llama3_h100_202412_torchtitan.md, table 5)"),
)


def pipelined(rows, budget_s: float) -> None:
    """The pipelined recipes' table: each recipe's plan (an expert strategy with the
    recipe's stages, schedule and micro-batches), its bubble, exposed communication, MFU and
    peak; with --search S, tl.search on the same mesh for S seconds (the recipe's batch
    sharding pinned) and whether it finds the recipe's plan or a faster one that fits."""
    print("| recipe | devices | parallelism | schedule | bubble | step (s) | compute (s) | "
          "exposed comm (s) | MFU | peak / device (GiB) | fits | published |"
          + (" search: plan | step (s) | fits | step / recipe's |" if budget_s else ""))
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|"
          + ("---|---:|---|---:|" if budget_s else ""))
    for r in rows:
        fn, fargs = tl.zoo.get(r.model, **r.config)
        cfg = fn.config
        an = tl.analyze(tl.trace(fn, *fargs))
        mesh = tl.Mesh(r.mesh, device=r.device)
        base = tl.strategies.expert(an, mesh, fit=False)[r.strategy]
        p = base.step.pipeline
        plan = base.with_micro_batches(r.micro_batches).with_pipeline(
            p.group, p.axis, p.stages, r.schedule, chunks=r.chunks)
        est = tl.estimate(an, plan, mesh)
        peak = mesh.device.peak_flops["bfloat16"]
        mfu = model_flops(an, cfg, cfg.batch * cfg.seq) / (est.step_time_s * mesh.size * peak)
        pipe = plan.step.pipeline
        cells = [r.name, f"{mesh.size}", r.strategy,
                 f"{r.schedule} {pipe}, {r.micro_batches} micro-batches",
                 f"{pipe.bubble(r.micro_batches):.1%}", f"{est.step_time_s:.3f}",
                 f"{est.compute_s:.3f}", f"{est.exposed_communication_s:.3f}", f"{mfu:.1%}",
                 f"{est.peak_memory_bytes / 2**30:.1f}", "yes" if est.feasible else "NO",
                 r.published]
        if budget_s:
            t0 = time.perf_counter()
            res = tl.search(an, mesh, pins={"batch": plan.axes_of("batch")},
                            budget_s=budget_s, seed=0)
            took = time.perf_counter() - t0
            found, fe = (res.plan, res.estimate) if res.feasible else (res.closest,
                                                                       res.closest_estimate)
            cells += [_brief(found),
                      f"{fe.step_time_s:.3f}", "yes" if res.feasible else "NO",
                      f"{fe.step_time_s / est.step_time_s:.3f} ({took:.0f} s)"]
        print("| " + " | ".join(cells) + " |", flush=True)
    print("\nSources:")
    for r in rows:
        print(f"- {r.name}: {r.source}. Traced with {r.note}.")


def _brief(plan) -> str:
    """The plan's sharded classes and its decisions beyond sharding, on one line."""
    parts = [f"{name} {'×'.join(axes)}" for name, axes in plan.class_axes.items() if axes]
    parts += [f"{name}={value}" for name, value in plan.step.names().items()]
    return ", ".join(parts)


@dataclass(frozen=True)
class PublishedRun:
    """A published training run kept aside: never used to tune the cost model or the search
    (--held-out). Its model is traced as a user first writes it, without jax.checkpoint; the
    search decides remat, micro-batches and sharding around the run's batch axes.
    published_step_s: the step time the source gives or implies (how: `derivation`)."""

    name: str
    model: str
    config: dict
    mesh: dict
    device: str
    batch_axes: tuple
    published_step_s: float
    derivation: str
    source: str


HELD_OUT = (
    PublishedRun("torchtitan-llama3-8b-a100x64", "llama",
                 dict(size="llama3.1-8b", batch=64, attention="cudnn"),
                 {"data": 64}, "a100-80gb", ("data",), 8192 / 2973,
                 "8192 tokens per GPU per step (local batch 1, seq 8192) / 2,973 tokens per "
                 "second per GPU",
                 "torchtitan docs/performance.md, 'Llama 3 performance numbers': Llama 3 8B "
                 "with FSDP2 on 64 A100 (80GB), batch size 1, selective op activation "
                 "checkpointing, 2973 WPS, 58.2% MFU; train_configs/llama3_8b.toml (a preset "
                 "for 64 A100 GPUs: batch_size 1, seq_len 8192, FSDP over all, compile "
                 "false). Llama 3 8B has Llama 3.1 8B's shapes."),
)


def model_flops(an, cfg, tokens: float) -> float:
    """PaLM's model flops of one step: (6 N + 12 L H Q T) per token."""
    prog = an.program
    n = sum(prog.values[v].nbytes / prog.values[v].dtype.itemsize
            for v, name in zip(prog.inputs, prog.input_names) if name.startswith("params/"))
    heads = cfg.heads
    attention = 12 * cfg.layers * heads * (cfg.embed // heads) * cfg.seq
    return (6 * n + attention) * tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--search", type=float, default=0.0)
    parser.add_argument("--without-remat", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--held-out", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--pipelined", action="store_true",
                        help="the recipes with pipeline stages (--search: and the search)")
    args = parser.parse_args()
    if args.pipelined:
        return pipelined([r for r in PIPELINED if not args.only or r.name in args.only],
                         args.search)
    if args.held_out:
        return held_out([r for r in HELD_OUT if not args.only or r.name in args.only],
                        args.held_out)
    rows = [r for r in RECIPES if not args.only or r.name in args.only]
    if args.without_remat:
        return without_remat(rows, args.without_remat)
    print("| recipe | devices | device | parallelism | step (s) | compute (s) | exposed comm (s) | "
          "comm by axis (s) | MFU | peak / device (GiB) | fits |"
          + (" search step (s) |" if args.search else ""))
    print("|---|---:|---|---|---:|---:|---:|---|---:|---:|---|" + ("---:|" if args.search else ""))
    for r in rows:
        fn, fargs = tl.zoo.get(r.model, **r.config)
        cfg = fn.config
        an = tl.analyze(tl.trace(fn, *fargs))
        mesh = _mesh(r)
        plan = tl.Plan.from_decisions(an, r.plan)
        est = tl.estimate(an, plan, mesh)
        peak = mesh.device.peak_flops["bfloat16"]
        mfu = model_flops(an, cfg, cfg.batch * cfg.seq) / (est.step_time_s * mesh.size * peak)
        axes = ", ".join(f"{a} {t:.3f}" for a, t in est.communication_by_axis.items())
        cells = [r.name, f"{mesh.size}", r.device, r.parallelism, f"{est.step_time_s:.3f}",
                 f"{est.compute_s:.3f}", f"{est.exposed_communication_s:.3f}", axes or "-",
                 f"{mfu:.1%}", f"{est.peak_memory_bytes / 2**30:.1f}",
                 "yes" if est.feasible else "NO"]
        if args.search:
            t0 = time.perf_counter()
            pins = {"batch": plan.axes_of("batch")}
            res = tl.search(an, mesh, pins=pins, budget_s=args.search, seed=0)
            found = res.estimate.step_time_s if res.estimate else float("nan")
            cells.append(f"{found:.3f} ({time.perf_counter() - t0:.0f} s)")
        print("| " + " | ".join(cells) + " |", flush=True)
    print("\nSources:")
    for r in rows:
        print(f"- {r.name}: {r.source}")
    print("\nMatmul efficiency the model gives one device (fraction of bf16 peak), M x N x K:")
    shapes = ((8192, 8192, 8192), (4096, 11008, 4096), (4096, 4096, 128), (1024, 1024, 1024),
              (128, 4096, 4096))
    print("| device | " + " | ".join("x".join(map(str, s)) for s in shapes) + " |")
    print("|---|" + "---:|" * len(shapes))
    for device in ("h100", "a100", "tpu-v5p", "tpu-v6e"):
        spec = tl.get_device(device)
        row = []
        for m, n, k in shapes:
            row.append(f"{_efficiency(spec, m, n, k):.2f}")
        print(f"| {device} | " + " | ".join(row) + " |")


def _mesh(r: Recipe):
    dcn = tl.get_device(r.device).inter_node
    return tl.Mesh(r.mesh, device=r.device, links={a: dcn for a in r.across_slices})


def without_remat(rows, budget_s: float) -> None:
    """The --without-remat table (module docstring)."""
    print("| recipe | recipe step (s) | recipe peak (GiB) | as written: smallest expert peak "
          "(GiB) | fastest expert that fits (its recipe's remat) | step (s) | search: remat, "
          "micro-batches | step (s) | peak (GiB) | fits | step / recipe's |")
    print("|---|---:|---:|---:|---|---:|---|---:|---:|---|---:|")
    for r in rows:
        mesh = _mesh(r)
        fn, fargs = tl.zoo.get(r.model, **r.config)
        an = tl.analyze(tl.trace(fn, *fargs))
        recipe = tl.estimate(an, tl.Plan.from_decisions(an, r.plan), mesh)
        bare_fn, bare_args = tl.zoo.get(r.model, **{**r.config, "remat": False})
        bare = tl.analyze(tl.trace(bare_fn, *bare_args))
        model = tl.cost_model(bare, mesh)
        experts = {k: model.estimate(p) for k, p in tl.strategies.expert(bare, mesh).items()}
        written = tl.strategies.expert(bare, mesh, fit=False)
        smallest = min(experts[k].peak_memory_bytes for k in written)
        fitting = {k: e for k, e in experts.items() if e.feasible}
        fastest = min(fitting, key=lambda k: fitting[k].step_time_s) if fitting else None
        pins = {"batch": tuple(r.plan["batch"])}
        t0 = time.perf_counter()
        res = tl.search(bare, mesh, pins=pins, budget_s=budget_s, seed=0)
        took = time.perf_counter() - t0
        plan, est = (res.plan, res.estimate) if res.feasible else (res.closest,
                                                                   res.closest_estimate)
        step = ", ".join(f"{k}={v}" for k, v in plan.step.names().items()) or "as written"
        expert_cells = (f"{fastest} | {fitting[fastest].step_time_s:.3f}" if fastest
                        else "none fits | -")
        print(f"| {r.name} | {recipe.step_time_s:.3f} | {recipe.peak_memory_bytes / 2**30:.1f} "
              f"| {smallest / 2**30:.1f} | {expert_cells} | {step} | {est.step_time_s:.3f} "
              f"| {est.peak_memory_bytes / 2**30:.1f} | {'yes' if res.feasible else 'NO'} "
              f"| {est.step_time_s / recipe.step_time_s:.3f} ({took:.0f} s) |", flush=True)


def held_out(runs, budget_s: float) -> None:
    """The --held-out table (module docstring)."""
    print("| run | devices | published step (s) | search: remat, micro-batches | step (s) | "
          "peak (GiB) | fits | estimate / published |")
    print("|---|---:|---:|---|---:|---:|---|---:|")
    for r in runs:
        mesh = tl.Mesh(r.mesh, device=r.device)
        fn, fargs = tl.zoo.get(r.model, **{**r.config, "remat": False})
        an = tl.analyze(tl.trace(fn, *fargs))
        t0 = time.perf_counter()
        res = tl.search(an, mesh, pins={"batch": r.batch_axes}, budget_s=budget_s, seed=0)
        took = time.perf_counter() - t0
        plan, est = (res.plan, res.estimate) if res.feasible else (res.closest,
                                                                   res.closest_estimate)
        step = ", ".join(f"{k}={v}" for k, v in plan.step.names().items()) or "as written"
        print(f"| {r.name} | {mesh.size} | {r.published_step_s:.3f} | {step} "
              f"| {est.step_time_s:.3f} | {est.peak_memory_bytes / 2**30:.1f} "
              f"| {'yes' if res.feasible else 'NO'} "
              f"| {est.step_time_s / r.published_step_s:.3f} ({took:.0f} s) |", flush=True)
    print("\nSources (published step time: how it follows from the source):")
    for r in runs:
        print(f"- {r.name}: {r.source} Step: {r.derivation}.")


def _efficiency(spec, m, n, k) -> float:
    """The model's matmul efficiency for one bf16 matmul on one device (compute-bound part)."""
    import dataclasses

    import jax
    fast = dataclasses.replace(spec, memory_bandwidth=1e18)  # the flops side of the roofline

    def f(x, w):
        return x @ w

    an = tl.analyze(tl.trace(f, jax.ShapeDtypeStruct((m, k), "bfloat16"),
                             jax.ShapeDtypeStruct((k, n), "bfloat16")))
    est = tl.estimate(an, tl.Plan.replicated(an), tl.Mesh({"data": 1}, device=fast))
    return float(2.0 * m * n * k / (est.compute_s * np.float64(spec.peak_flops["bfloat16"])))


if __name__ == "__main__":
    main()
