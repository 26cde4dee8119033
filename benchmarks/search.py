"""MCTS against the expert strategies, random search and exhaustive enumeration.

    python benchmarks/search.py [--budget 5] [--quick] [--no-compile]

Per model and mesh, all on the same cost model: the best expert strategy, MCTS, random search
with the same budget, and exhaustive enumeration where the space holds at most 1e5 plans —
step time, peak memory per device, whether it fits, and when the search reached its answer.
Beside MCTS: analysis + search-to-best time, and the XLA compile time of the chosen plan on
simulated CPU devices (where the mesh has at most 8 devices). A second table compares every
expert strategy with the search's plan; where a strategy does not fit under the row's cap as
written, the experts include it with its recipe's remat and micro-batches ("fsdp (remat
full)", tl.strategies.expert). "plans" is the size of the classic space (one decision
per class and conflict), which exhaustive and random search draw from; MCTS also decides
per-domain overrides. Goals: MCTS at least as good as every expert strategy on every row
(within the default budget) and feasible where data parallel is not; analysis + search faster
than XLA compiles that plan; the 96-layer model under 30 s.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import toast_lab as tl  # noqa: E402
from toast_lab.plan_search import EXHAUSTIVE_LIMIT, Space, exhaustive, random_search, search  # noqa

_GPT_128B = dict(size="gpt3-175b", layers=70, remat=True, dtype="bfloat16")

CASES = [
    # (model, config, mesh, device[, memory cap in GiB (None: the device's memory)[, the mesh
    # axes that cross slices over the data-center network]])
    ("mlp", dict(batch=4096, features=1024, hidden=(4096, 4096), classes=1024),
     {"data": 4, "model": 2}, "h100"),
    ("mlp", dict(batch=4096, features=1024, hidden=(4096, 4096), classes=1024),
     {"data": 2, "fsdp": 2, "model": 2}, "h100"),
    ("gnn", dict(nodes=65536, edges=262144, features=256, hidden=512, mlp=1024),
     {"data": 4, "model": 2}, "h100"),
    ("moe", dict(batch=64, seq=512, embed=512, heads=8, mlp=2048, vocab=8192),
     {"data": 8}, "h100"),
    ("gpt", dict(size="gpt2-small"), {"data": 8}, "h100"),
    ("gpt", dict(size="gpt2-small"), {"data": 4, "model": 2}, "h100"),
    ("gpt", dict(size="gpt2-small"), {"data": 2, "fsdp": 2, "model": 2}, "h100"),
    ("gpt", dict(size="gpt2-large"), {"data": 4, "model": 2}, "a100-80gb", 48),
    ("gpt", dict(size="gpt3-175b", remat=True, dtype="bfloat16"),
     {"data": 8, "fsdp": 8, "model": 4}, "tpu-v5p"),
    # A 128B-parameter GPT (GPT-3's width, 70 layers) on 128 and 256 v5p chips, and on two
    # 128-chip slices whose `dcn` axis crosses the data-center network.
    ("gpt", dict(_GPT_128B, batch=256), {"data": 2, "fsdp": 16, "tensor": 4}, "tpu-v5p"),
    ("gpt", dict(_GPT_128B, batch=512), {"data": 4, "fsdp": 16, "tensor": 4}, "tpu-v5p"),
    ("gpt", dict(_GPT_128B, batch=512), {"dcn": 2, "fsdp": 32, "tensor": 4}, "tpu-v5p", None,
     ("dcn",)),
    # The scanned GPT (64 layers, GPT-3's width) on 4 nodes of 8 H100s, whose `node` axis
    # crosses InfiniBand: the mesh the pipelined recipes (dp+pp, tp+pp+dp, fsdp+tp+pp) cut
    # into stages across nodes; and 8 layers of it on 8 simulated devices, compiled.
    ("gpt_scan", dict(_GPT_128B, layers=64, batch=256), {"node": 4, "data": 2, "model": 8},
     "h100"),
    ("gpt_scan", dict(size="gpt2-small", layers=8, batch=16), {"stage": 2, "data": 2,
                                                               "model": 2}, "h100"),
]
QUICK = {0, 4, 5}


def _fmt(est, limit) -> str:
    if est is None:
        return "— | — | —"
    return (f"{est.step_time_s * 1e3:,.1f} | {est.peak_memory_bytes / 2**30:,.2f} | "
            f"{'yes' if est.peak_memory_bytes <= limit else 'no'}")


def _reach(res) -> str:
    return f"{res.history[-1][0]:.2f}" if res.history else "—"


def _label(name, config, an) -> str:
    if config.get("layers") and "size" in config:  # a preset resized: say how big it is
        prog = an.program
        params = sum(int(np.prod(prog.values[v].shape)) for v, path in
                     zip(prog.inputs, prog.input_names) if path.startswith("params"))
        return f"{name}-{params / 1e9:.0f}b"
    return f"{name}{'-' + config['size'] if 'size' in config else ''}"


def run_case(name, config, shape, device, budget, compile_plan, cap_gib=None, dcn=()):
    """(the summary row, the per-expert rows) of one case."""
    fn, args = tl.zoo.get(name, **config)
    t0 = time.perf_counter()
    an = tl.analyze(tl.trace(fn, *args))
    analysis_s = time.perf_counter() - t0
    spec = tl.get_device(device)
    mesh = tl.Mesh(shape, device=spec, links={a: spec.inter_node for a in dcn})
    cap = None if cap_gib is None else cap_gib * 2**30
    space = Space(an, mesh)
    experts = {k: tl.estimate(an, p, mesh)
               for k, p in tl.strategies.expert(an, mesh, memory_cap=cap).items()}
    limit = mesh.device.memory_bytes if cap is None else cap
    fits = lambda e: e is not None and e.peak_memory_bytes <= limit  # noqa: E731
    feasible = {k: e for k, e in experts.items() if fits(e)}
    pool = feasible or experts
    best_name = min(pool, key=lambda k: pool[k].step_time_s)
    dp = experts.get("dp")
    mcts = search(an, mesh, budget_s=budget, seed=0, memory_cap=cap)
    rnd = random_search(an, mesh, budget_s=budget, seed=0, memory_cap=cap)
    exh = exh_s = None
    if space.size <= EXHAUSTIVE_LIMIT:
        t0 = time.perf_counter()
        exh = exhaustive(an, mesh, memory_cap=cap)
        exh_s = time.perf_counter() - t0
    compile_s = None
    if compile_plan and mesh.size <= 8 and mcts.plan is not None and len(an.program.ops) < 8000:
        t0 = time.perf_counter()
        mcts.plan.jit(fn, mesh.jax_mesh()).lower(*args).compile()
        compile_s = time.perf_counter() - t0
    reach = mcts.history[-1][0] if mcts.history else budget
    mesh_name = "x".join(str(s) for s in shape.values()) + f" {device}"
    if dcn:
        mesh_name += f" ({'/'.join(dcn)} over DCN)"
    if cap_gib is not None:
        mesh_name += f", cap {cap_gib} GiB"
    label = _label(name, config, an)
    found = mcts.estimate or mcts.closest_estimate
    row = (f"| {label} | {mesh_name} | {space.size:.3g} | {best_name} | "
           f"{_fmt(experts[best_name], limit)} | {_fmt(dp, limit)} | {_fmt(found, limit)} "
           f"| {_reach(mcts)} | {mcts.simulations / mcts.elapsed_s:,.0f} | "
           f"{_fmt(rnd.estimate or rnd.closest_estimate, limit)} | "
           f"{'—' if exh is None else f'{exh.estimate.step_time_s * 1e3:,.1f} in {exh_s:.1f} s'}"
           f" | {analysis_s:.1f} + {reach:.1f} | "
           f"{'—' if compile_s is None else f'{compile_s:.1f}'} |")
    per_expert = []
    for k, e in experts.items():
        # The search is at least as good as an expert when it fits and the expert does not,
        # or both fit and its step is no slower (or neither fits and its peak is no higher).
        if found is None:
            verdict = "no plan"
        elif fits(found) != fits(e):
            verdict = "yes" if fits(found) else "NO"
        elif fits(e):
            verdict = "yes" if found.step_time_s <= e.step_time_s * (1 + 1e-9) else "NO"
        else:
            verdict = "yes" if found.peak_memory_bytes <= e.peak_memory_bytes else "NO"
        per_expert.append(f"| {label} | {mesh_name} | {k} | {_fmt(e, limit)} | "
                          f"{'—' if found is None else f'{found.step_time_s * 1e3:,.1f}'} | "
                          f"{'—' if found is None else f'{found.step_time_s / e.step_time_s:.3f}'}"
                          f" | {verdict} |")
    return row, per_expert


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=5.0, help="seconds per search")
    parser.add_argument("--quick", action="store_true", help="three small cases only")
    parser.add_argument("--no-compile", action="store_true", help="skip XLA compile timing")
    parser.add_argument("--cases", type=int, nargs="*", help="only these case indices")
    args = parser.parse_args()
    print("Step in ms, peak in GiB per device. 'reach': seconds until MCTS found its answer.\n")
    print("| model | mesh | plans | best expert | step | peak | fits | dp step | dp peak | "
          "dp fits | MCTS step | peak | fits | reach (s) | plans/s | random step | peak | fits "
          "| exhaustive | analysis + search (s) | XLA compile (s) |")
    print("|" + "---|" * 21)
    experts = []
    for i, case in enumerate(CASES):
        if args.quick and i not in QUICK or args.cases and i not in args.cases:
            continue
        name, config, shape, device, *extra = case
        row, per_expert = run_case(name, config, shape, device, args.budget,
                                   not args.no_compile, *extra)
        print(row, flush=True)
        experts += per_expert
    print("\nEvery expert strategy against the search (the MCTS plan above). 'search ≥ expert': "
          "the search's plan fits where the expert's does not, or is no slower.\n")
    print("| model | mesh | expert | step | peak | fits | search step | search / expert | "
          "search ≥ expert |")
    print("|" + "---|" * 9)
    print("\n".join(experts))


if __name__ == "__main__":
    main()
