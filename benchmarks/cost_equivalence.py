"""Proof that a change to the cost model changed nothing but its speed: every figure of every
plan, bit for bit, against another revision of the repository.

    python benchmarks/cost_equivalence.py --against <git revision> [--quick]
    python benchmarks/cost_equivalence.py --dump figures.pkl     (one side only)

The cases: every model of benchmarks/fidelity.py (the zoo at its tiny sizes and the thirteen
third-party steps) x its expert strategies and two random plans, on a data=4 x model=2 mesh of
CPUs (XLA:CPU's passes), H100s (XLA:GPU's: reassociated all-reduces, fused attention) and TPU
v5p chips; and every recipe of benchmarks/step_time.py on its own mesh. For each plan:
every field of its `Estimate`, and `CostModel.op_breakdown` (compute and communication seconds
per op, and every collective each op pays: the kernel's ledger read back to ops). For each
model and mesh, a walk of 40 single-decision edits through `IncrementalEstimator` (step time
and peak after each), and a seeded search of 300 simulations (its plan and estimate).

`--against` checks the revision out into a temporary git worktree, dumps its figures there (in
a subprocess: its numba kernel compiles on first use), dumps this tree's, and compares them
with `==` on every float: a difference of one unit in the last place is a difference. Prints
the cases compared and every one that differs; exits 1 if any does.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import pickle  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEVICES = ("cpu", "h100", "tpu-v5p")
EDITS = 40
SIMULATIONS = 300


def _figures(model, plan) -> dict:
    est = model.estimate(plan)
    compute, comm, collectives = model.op_breakdown(plan)
    return {"estimate": dataclasses.asdict(est), "op_compute": compute, "op_comm": comm,
            "op_collectives": {n: tuple((c.kind, c.axes, c.operand, c.count, c.bytes, c.time_s)
                                        for c in cs)
                               for n, cs in collectives.items()}}


def _edits(tl, an, mesh, model) -> list:
    """(step, peak) after each of EDITS seeded single-decision edits of one plan."""
    from toast_lab.plan_search import Space

    space = Space(an, mesh)
    rng = np.random.default_rng(0)
    inc = model.incremental()
    out = []
    for _ in range(EDITS):
        d = space.decisions[int(rng.integers(len(space.decisions)))]
        c = int(rng.integers(len(d.choices)))
        if d.kind == "class":
            out.append(inc.set_axes(d.index, d.choices[c]))
        elif d.kind == "conflict":
            out.append(inc.set_resolution(d.index, c))
        elif d.kind == "override" and d.choices[c] is not None:
            out.append(inc.set_axes(d.index, d.choices[c], domain=d.domain))
        # (an estimator edits sharding only: a step decision, or an override given back to
        # its class, has no edit of its own)
    return out


def _search(tl, an, mesh) -> tuple:
    # (no time budget: a search cut short by a loaded machine would compare another plan)
    res = tl.search(an, mesh, simulations=SIMULATIONS, budget_s=None, seed=0)
    if res.plan is None:
        return (None, None)
    return (tuple(res.plan.assignments), dataclasses.asdict(res.estimate))


def dump(path: str, quick: bool) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT))
    import fidelity
    import step_time
    import toast_lab as tl

    out = {}
    names = list(tl.zoo.names()) + list(fidelity.EXTERNAL) + list(fidelity.THIRD_PARTY)
    for name in names[:3] if quick else names:
        fn, fargs, _ = fidelity._model(name)
        an = tl.analyze(tl.trace(fn, *fargs))
        for device in DEVICES[:1] if quick else DEVICES:
            mesh = tl.Mesh({"data": 4, "model": 2}, device=device)
            model = tl.cost_model(an, mesh)
            plans = dict(tl.strategies.expert(an, mesh))
            rng = np.random.default_rng(0)
            for k in range(2):
                plans[f"random{k}"] = tl.random_plan(an, mesh, rng)
            for pname, plan in plans.items():
                out[f"{name}/{device}/{pname}"] = _figures(model, plan)
            out[f"{name}/{device}/incremental"] = _edits(tl, an, mesh, model)
            out[f"{name}/{device}/search"] = _search(tl, an, mesh)
        print(f"  {name}", flush=True)
    for r in step_time.RECIPES[:1] if quick else step_time.RECIPES:
        fn, fargs = tl.zoo.get(r.model, **r.config)
        an = tl.analyze(tl.trace(fn, *fargs))
        dcn = tl.get_device(r.device).inter_node
        mesh = tl.Mesh(r.mesh, device=r.device, links={a: dcn for a in r.across_slices})
        out[f"recipe/{r.name}"] = _figures(tl.cost_model(an, mesh),
                                           tl.Plan.from_decisions(an, r.plan))
        print(f"  {r.name}", flush=True)
    with open(path, "wb") as f:
        pickle.dump(out, f)


def _differences(a, b, where: str) -> list[str]:
    """Where a and b differ, exactly (floats by ==, NaN equal to NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(map(str, a.keys() ^ b.keys()))[:6]}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        if len(a) != len(b):
            return [f"{where}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b))
                for d in _differences(x, y, f"{where}[{i}]")]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
            bad = np.argwhere(a != b)[:3].tolist() if a.shape == b.shape else "shape"
            return [f"{where}: arrays differ at {bad}"]
        return []
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return []
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="a git revision to compare this tree with")
    parser.add_argument("--dump", help="write this tree's figures to a file and stop")
    parser.add_argument("--quick", action="store_true", help="three models, the CPU mesh, "
                        "one recipe")
    args = parser.parse_args()
    if args.dump:
        dump(args.dump, args.quick)
        return
    if not args.against:
        parser.error("give --against REVISION or --dump FILE")
    with tempfile.TemporaryDirectory() as tmp:
        ref = Path(tmp) / "ref"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(ref),
                        args.against], check=True, capture_output=True)
        try:
            sides = {}
            for label, tree in ((args.against, ref), ("this tree", ROOT)):
                t0 = time.perf_counter()
                print(f"{label}:", flush=True)
                out = Path(tmp) / f"{'ref' if tree == ref else 'new'}.pkl"
                script = tree / "benchmarks" / Path(__file__).name
                if tree == ref:  # this script, run inside the revision's tree
                    script.write_text(Path(__file__).read_text())
                cmd = [sys.executable, str(script), "--dump", str(out)]
                env = dict(os.environ, PYTHONPATH=str(tree))
                subprocess.run(cmd + (["--quick"] if args.quick else []), check=True,
                               env=env, cwd=tree)
                with open(out, "rb") as f:
                    sides[label] = pickle.load(f)
                print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref)],
                           capture_output=True)
    old, new = sides[args.against], sides["this tree"]
    bad = _differences(old, new, "")
    print(f"\n{len(old)} cases compared ({sum(k.count('/') == 2 for k in old)} plans on "
          f"fidelity models, {sum(k.startswith('recipe/') for k in old)} recipes): "
          f"{'identical' if not bad else f'{len(bad)} differences'}")
    for line in bad[:60]:
        print(" ", line)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
