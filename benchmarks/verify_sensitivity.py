"""How tl.verify's per-leaf allowance (toast_lab/verification/_sensitivity.py) behaves: the
figures behind its factor and perturbation.

    python benchmarks/verify_sensitivity.py [--plans 10] [--seeds 4] [--skip-zoo]

1. Ill-conditioned leaves on correct plans. Steps whose parameters include some with an exact
   gradient of zero (tests/ill_conditioned.py: a flax.nnx bias before BatchNorm, a Keras-style
   key bias under optax.adam; tests/third_party: Keras 3's MultiHeadAttention from 3 seeds),
   `--plans` random plans on each of the meshes 8, 4x2 and 2x2x2 plus the expert plans on 4x2,
   each compared with the unsharded step, whose perturbed run is drawn with `--seeds` seeds.
   For every leaf the allowance loosens: error / spread (what SPREAD_FACTOR must exceed), how
   many of those leaves the dtype tolerance alone fails, and how many fail the allowance.
2. Well-conditioned leaves. For the zoo (tiny sizes) and the third-party steps: the largest
   spread of a leaf that is not loosened, how many leaves are loosened, and their smallest
   spread: the gap the factor sits in.
3. Cost. Seconds for the sharded compile, the first reference run (its compile included) and
   the perturbed reference run, which reuses that compile.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the models

import argparse  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import toast_lab as tl  # noqa: E402
from toast_lab import random_plan  # noqa: E402
from toast_lab.verification import FAST_COMPILE, compare_outputs  # noqa: E402
from toast_lab.verification._sensitivity import SPREAD_FACTOR, perturb_inputs  # noqa: E402

MESHES = {"8": {"data": 8}, "4x2": {"data": 4, "model": 2},
          "2x2x2": {"data": 2, "fsdp": 2, "model": 2}}


def ill_conditioned_steps():
    from tests import ill_conditioned as ill

    yield "nnx bias before BatchNorm", ill.nnx_bias_before_batchnorm, "raise"
    yield "attention key bias", ill.attention_with_key_bias, "raise"
    for seed in range(3):
        yield f"keras MultiHeadAttention (seed {seed})", _keras(seed), "allow"


def _keras(seed):
    def build():
        import keras

        from tests.third_party.models import BUILDERS

        keras.utils.set_random_seed(seed)
        return BUILDERS["keras"][0]()

    return build


def reference_runs(fn, args, seeds):
    """The unsharded step's outputs, and its outputs on inputs perturbed with each seed."""
    reference = jax.jit(fn, compiler_options=FAST_COMPILE)
    ref = jax.device_get(reference(*args))
    return ref, [jax.device_get(reference(*perturb_inputs(args, s))) for s in seeds]


def sharded_run(fn, args, plan, mesh):
    jax_mesh = mesh.jax_mesh()
    # No donation: `args` (device arrays for nnx's state) serve every plan and the reference.
    step = plan.jit(fn, jax_mesh, donate=False, compiler_options=FAST_COMPILE)
    in_shardings, _ = plan.shardings(jax_mesh)
    return jax.device_get(step(*jax.device_put(args, in_shardings)))


def plans_of(an, per_mesh):
    for name, axes in MESHES.items():
        mesh = tl.Mesh(axes)
        rng = np.random.default_rng([len(name), 11])
        for _ in range(per_mesh):
            yield mesh, random_plan(an, mesh, rng)
        if name == "4x2":
            for plan in tl.strategies.expert(an, mesh).values():
                yield mesh, plan


def ill_conditioned_table(per_mesh, seeds):
    print("1. ill-conditioned leaves on correct plans (each leaf x plan x perturbation seed)")
    head = (f"{'step':<34}{'plans':>6}{'leaves':>8}{'err/spread max':>16}{'p99':>7}"
            f"{'median':>8}{'fail at dtype tol':>19}{f'fail at {SPREAD_FACTOR:g} x spread':>20}")
    print(head)
    everything = []
    for label, build, promotion in ill_conditioned_steps():
        with jax.numpy_rank_promotion(promotion), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn, args = build()
            an = tl.analyze(tl.trace(fn, *args))
            ref, moved = reference_runs(fn, args, range(seeds))
            ratios, strict_fails, fails, plans = [], 0, 0, 0
            for mesh, plan in plans_of(an, per_mesh):
                out = sharded_run(fn, args, plan, mesh)
                plans += 1
                for perturbed in moved:
                    for c in compare_outputs(out, ref, perturbed=perturbed):
                        if c.loosened and np.isfinite(c.tolerance):
                            ratios.append(c.error / c.spread)
                            strict_fails += c.error > c.base_tolerance
                            fails += not c.ok
        r = np.array(ratios)
        everything.extend(ratios)
        print(f"{label:<34}{plans:>6}{r.size:>8}{r.max():>16.2f}{np.percentile(r, 99):>7.2f}"
              f"{np.median(r):>8.2f}{strict_fails:>19}{fails:>20}")
    r = np.array(everything)
    print(f"{'all':<34}{'':>6}{r.size:>8}{r.max():>16.2f}{np.percentile(r, 99):>7.2f}"
          f"{np.median(r):>8.2f}")
    print()


def well_conditioned_table():
    print("2. spreads (perturbed vs unsharded reference, seed 0) of every output leaf")
    print(f"{'step':<34}{'leaves':>8}{'largest spread kept':>21}{'loosened':>10}"
          f"{'smallest spread loosened':>26}")
    steps = [(name, lambda name=name: (tl.zoo.get(name)[0], tl.zoo.sample(name, seed=0)),
              "raise") for name in tl.zoo.names()]
    from tests.third_party.models import BUILDERS
    for name, (builder, module) in BUILDERS.items():
        steps.append((f"third-party {name}", builder, "allow" if name == "keras" else "raise"))
    steps += [(label, build, promotion) for label, build, promotion in ill_conditioned_steps()]
    for label, build, promotion in steps:
        with jax.numpy_rank_promotion(promotion), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                fn, args = build()
            except ImportError as err:
                print(f"{label:<34} skipped ({err})")
                continue
            ref, (moved,) = reference_runs(fn, args, [0])
        checks = compare_outputs(ref, ref, perturbed=moved)
        kept = [c.spread for c in checks if not c.loosened]
        loose = [c.spread for c in checks if c.loosened]
        print(f"{label:<34}{len(checks):>8}{max(kept, default=0):>21.2g}{len(loose):>10}"
              f"{(f'{min(loose):.2g}' if loose else '-'):>26}")
    print()


def cost_table():
    print("3. seconds: sharded compile, first reference run (compile included), perturbed run")
    print(f"{'zoo model':<14}{'sharded compile':>17}{'reference':>11}{'perturbed':>11}")
    mesh = tl.Mesh(MESHES["4x2"])
    for name in tl.zoo.names():
        fn, shapes = tl.zoo.get(name)
        args = tl.zoo.sample(name, seed=0)
        an = tl.analyze(tl.trace(fn, *shapes))
        plan = tl.strategies.expert(an, mesh)["dp"]
        jax_mesh = mesh.jax_mesh()
        in_shardings, _ = plan.shardings(jax_mesh)
        start = time.perf_counter()
        plan.jit(fn, jax_mesh, donate=False, compiler_options=FAST_COMPILE).lower(
            *jax.device_put(args, in_shardings)).compile()
        sharded = time.perf_counter() - start
        reference = jax.jit(fn, compiler_options=FAST_COMPILE)
        start = time.perf_counter()
        jax.block_until_ready(reference(*args))
        first = time.perf_counter() - start
        moved = perturb_inputs(args, 0)
        start = time.perf_counter()
        jax.block_until_ready(reference(*moved))
        second = time.perf_counter() - start
        print(f"{name:<14}{sharded:>17.2f}{first:>11.2f}{second:>11.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=10, help="random plans per mesh")
    parser.add_argument("--seeds", type=int, default=4, help="perturbation seeds")
    parser.add_argument("--skip-zoo", action="store_true", help="only table 1")
    opts = parser.parse_args()
    jax.config.update("jax_numpy_rank_promotion", "raise")
    ill_conditioned_table(opts.plans, opts.seeds)
    if not opts.skip_zoo:
        well_conditioned_table()
        cost_table()


if __name__ == "__main__":
    main()
