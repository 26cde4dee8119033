"""Cost-model evaluations per second on the 12-layer GPT-2-small training step.

    python benchmarks/estimate_speed.py [--layers 12] [--seconds 3]

- full: `CostModel.step_and_peak` of a whole plan from scratch (what MCTS calls per rollout);
- incremental: `IncrementalEstimator.set_axes`, one class changed per call;
- estimate: `CostModel.estimate` with every detail (collectives, scopes) built.
Plans are random valid plans; the first call (numba compiling the kernel, cached on disk after
that) is excluded. Goal: at least 10,000 incremental evaluations per second.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import toast_lab as tl
from toast_lab.cost import CostModel
from toast_lab.plan_search import Space


def rate(fn, seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            fn()
        n += 100
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    fn, fargs = tl.zoo.get("gpt", size="gpt2-small", layers=args.layers)
    an = tl.analyze(tl.trace(fn, *fargs))
    print(f"GPT-2-small, {args.layers} layers: {len(an.program.ops):,} ops, "
          f"{len(an.program.values):,} values, {len(an.classes)} classes\n")
    print("| mesh | build (s) | value types | op types | full eval/s | incremental eval/s | "
          "estimate/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for shape in ({"data": 8}, {"data": 4, "model": 2}, {"data": 2, "fsdp": 2, "model": 2}):
        mesh = tl.Mesh(shape, device="h100")
        t0 = time.perf_counter()
        model = CostModel(an, mesh)
        build = time.perf_counter() - t0
        space = Space(an, mesh)
        plans = []
        for _ in range(64):
            ch = np.array([rng.integers(len(d.choices)) for d in space.decisions])
            plans.append(space.arrays(ch))
        model.step_and_peak(*plans[0])  # compile the kernel (or load it from the cache)
        i = iter(range(10**12))
        full = rate(lambda: model.step_and_peak(*plans[next(i) % 64]), args.seconds)
        inc = model.incremental()
        moves = [(d.index, d.choices[c]) for d in space.decisions if d.kind == "class"
                 for c in range(len(d.choices))]
        j = iter(range(10**12))

        def step():
            cls, axes = moves[next(j) % len(moves)]
            inc.set_axes(cls, axes)

        incremental = rate(step, args.seconds)
        k = iter(range(10**12))
        detailed = rate(lambda: model.evaluate(*plans[next(k) % 64]), args.seconds / 2)
        name = " x ".join(f"{a}={s}" for a, s in shape.items())
        tables = model.ty.tables
        print(f"| {name} | {build:.2f} | {len(tables.value_classes)} | {len(tables.ops)} | "
              f"{full:,.0f} | {incremental:,.0f} | {detailed:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
