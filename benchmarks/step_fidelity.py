"""How close the estimate of a plan with remat and micro-batches comes to XLA's compile of it.

    python benchmarks/step_fidelity.py [--models gpt_scan gpt llama moe] [--counts 1 2 4]

For each zoo model (layers=4, batch=16, seq=128), the fsdp+tp expert plan on a "cpu" mesh
data=2 x model=4, every remat policy of its repeated layer group x every micro-batch count
the step allows: the estimate (tl.cost_model) beside what XLA:CPU compiles of plan.jit's
rewritten step on 8 simulated devices. Peak memory per device (MiB) and flops (GFLOP, a
loop body counted once, as XLA's cost_analysis() counts it), each with estimate ÷ XLA. The
issue's goal: peak within 20%, flops within 10%. A micro-batch count the step cannot take
(a batch the forward couples, as an MoE's capacity-limited routing does) is listed under
the table, refused, with the reason.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402

import jax  # noqa: E402

import toast_lab as tl  # noqa: E402
from toast_lab.verification import FAST_COMPILE, read_compiled  # noqa: E402

POLICIES = ("everything", "dots_with_no_batch_dims", "full")
MESH = tl.Mesh({"data": 2, "model": 4}, device="cpu")


def rows(name: str, counts):
    """(policy, count, estimate, XLA's CompiledStats or the reason the count is refused)."""
    fn, args = tl.zoo.get(name, layers=4, batch=16, seq=128)
    an = tl.analyze(tl.trace(fn, *args))
    (group,) = [g.name for g in an.layer_groups if g.kind != "scope"]
    base = tl.strategies.expert(an, MESH)["fsdp+tp"]
    model = tl.cost_model(an, MESH)
    jax_mesh = MESH.jax_mesh(jax.devices()[:MESH.size])
    for policy in POLICIES:
        for count in counts:
            plan = base.with_remat(group, policy)
            try:
                plan = plan.with_micro_batches(count) if count > 1 else plan
            except tl.PlanError as err:
                yield policy, count, None, str(err).split(": ", 2)[-1]
                continue
            est = model.estimate(plan)
            xla = read_compiled(plan.jit(fn, jax_mesh, compiler_options=FAST_COMPILE)
                                .lower(*args).compile(), jax_mesh)
            yield policy, count, est, xla


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt_scan", "gpt", "llama", "moe"])
    parser.add_argument("--counts", nargs="+", type=int, default=[1, 2, 4])
    args = parser.parse_args()
    print("| model | policy | micro-batches | peak est MiB | peak XLA MiB | ratio "
          "| GFLOP est | GFLOP XLA | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    misses = total = 0
    refused = {}
    for name in args.models:
        for policy, count, est, xla in rows(name, args.counts):
            if est is None:
                refused.setdefault((name, xla), set()).add(count)
                continue
            peak = est.peak_memory_bytes / xla.peak_bytes
            flops = est.flops_loop_bodies_once / xla.flops
            total += 1
            misses += abs(peak - 1) > 0.20 or abs(flops - 1) > 0.10
            print(f"| {name} | {policy} | {count} | {est.peak_memory_bytes / 2**20:.1f} "
                  f"| {xla.peak_bytes / 2**20:.1f} | {peak:.2f} "
                  f"| {est.flops_loop_bodies_once / 1e9:.3f} | {xla.flops / 1e9:.3f} "
                  f"| {flops:.2f} |", flush=True)
    print(f"\n{total - misses}/{total} plans within the goal (peak ±20%, flops ±10%)")
    for (name, reason), counts in refused.items():
        print(f"{name}: micro-batches {', '.join(map(str, sorted(counts)))} refused: {reason}")


if __name__ == "__main__":
    main()
