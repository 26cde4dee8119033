"""The Lab's latency on GPT-2-small (12 and 24 layers), data=4 x model=2 H100s.

    python benchmarks/lab_latency.py [--layers 12 24] [--pins 60] [--search-s 3] [--repeats 5]

Rows per depth (issue #10's goals in brackets):
- construction: tl.Lab(fn, *args, mesh=...) from the function to the first view model
  (trace + analysis + cost model + scope tree + first view), and the Lab's own share;
- view model: nodes and edges drawn when collapsed, groups, JSON size;
- pin -> estimate + colours: Python time from `pin` to the widget's traitlets assigned (the
  view model rebuilt, choices re-priced, JSON and op-cost buffer made) [p95 < 50 ms];
- search rate: simulations per second of a background search inside the Lab (the widget fed
  with every published plan) against headless `tl.search` over the same time [>= 70 %].

The browser's rows (time to the first rendered graph in Chromium, pin -> update seen in the
page) come from tests/e2e's harness: a measurement is a function `(case) -> list of rows`
appended to MEASUREMENTS.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import toast_lab as tl
from toast_lab.lab import Lab

MESH = {"data": 4, "model": 2}
DEVICE = "h100"


class NullWidget:
    """Receives the traitlets like a LabView (and keeps the last), without a front end."""

    view, op_costs = None, None

    def on_event(self, callback):
        self.callback = callback


class Case:
    """One depth: the function, its Lab, and what the measurements share."""

    def __init__(self, layers: int, args):
        self.layers, self.args = layers, args
        self.fn, self.fn_args = tl.zoo.get("gpt", size="gpt2-small", layers=layers)
        self.mesh = tl.Mesh(MESH, device=DEVICE)
        t0 = time.perf_counter()  # the first Lab of this depth: tracing included, cold
        Lab(self.fn, *self.fn_args, mesh=self.mesh, widget=NullWidget())
        self.construction_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.program = tl.trace(self.fn, *self.fn_args)
        self.analysis = tl.analyze(self.program)
        tl.estimate(self.analysis, tl.Plan.replicated(self.analysis), self.mesh)  # compile
        self.trace_s = time.perf_counter() - t0
        self.lab = None

    def fresh_lab(self) -> Lab:
        return Lab.from_analysis(self.analysis, self.mesh, widget=NullWidget())


def construction(case: Case) -> list[tuple[str, str, str]]:
    total = case.construction_s
    t0 = time.perf_counter()
    case.lab = case.fresh_lab()
    own = time.perf_counter() - t0
    return [("Lab construction (fn -> first view)", f"{total:.2f} s", ""),
            ("  of which the Lab itself (session, scope tree, first view)", f"{own:.3f} s", "")]


def view_size(case: Case) -> list[tuple[str, str, str]]:
    vm = case.lab.view
    doc = json.dumps(vm.to_dict())
    return [("view model: nodes / edges drawn collapsed",
             f"{len(vm.graph.nodes)} / {len(vm.graph.edges)}", "a few dozen"),
            ("view model: groups / JSON size", f"{len(vm.groups)} / {len(doc) / 1024:.0f} KiB",
             "")]


def pin_latency(case: Case) -> list[tuple[str, str, str]]:
    lab = case.lab
    moves = [("batch", ("data",)), ("heads", ("model",)), ("mlp", ("model",)),
             ("embed", ("data",)), ("vocab", ("model",)), ("seq", ())]
    times = []
    for i in range(case.args.pins):
        name, axes = moves[i % len(moves)]
        if i // len(moves) % 2:
            axes = ()  # second round: back to replicated
        t0 = time.perf_counter()
        lab.pin(name, axes)
        times.append(time.perf_counter() - t0)
        assert lab.widget.view["estimate"]["step_time_s"] == lab.estimate.step_time_s
    times.sort()
    p50 = statistics.median(times)
    p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
    return [("pin -> estimate + colours (Python) p50 / p95",
             f"{p50 * 1e3:.1f} / {p95 * 1e3:.1f} ms", "p95 < 50 ms")]


def search_rate(case: Case) -> list[tuple[str, str, str]]:
    """Medians of interleaved runs: a shared machine's load moves both alike."""
    budget = case.args.search_s
    base, inside, ratios, updates = [], [], [], []
    for seed in range(case.args.repeats):
        headless = tl.search(case.analysis, case.mesh, budget_s=budget, seed=seed)
        lab = case.fresh_lab()
        views = []
        lab.session.add_listener(lambda change: views.append(change))
        result = lab.search(budget_s=budget, seed=seed).result()
        base.append(headless.simulations / headless.elapsed_s)
        inside.append(result.simulations / result.elapsed_s)
        ratios.append(inside[-1] / base[-1])
        updates.append(len(views))
    med = statistics.median
    return [("search: headless tl.search (median)", f"{med(base):,.0f} sims/s", ""),
            ("search: inside the Lab, widget fed (median)",
             f"{med(inside):,.0f} sims/s, ratio {med(ratios):.0%} (runs: "
             f"{', '.join(f'{r:.0%}' for r in ratios)}; {med(updates):.0f} views/run)",
             ">= 70 %")]


MEASUREMENTS = [construction, view_size, pin_latency, search_rate]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 24])
    parser.add_argument("--pins", type=int, default=60)
    parser.add_argument("--search-s", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for layers in args.layers:
        case = Case(layers, args)
        print(f"\nGPT-2-small, {layers} layers: {len(case.program.ops):,} ops, "
              f"{len(case.analysis.classes)} classes, {len(case.analysis.conflicts)} conflicts; "
              f"mesh {case.mesh} (trace + analysis {case.trace_s:.2f} s)\n")
        print("| measure | value | goal |\n|---|---:|---|")
        for measure in MEASUREMENTS:
            for name, value, goal in measure(case):
                print(f"| {name} | {value} | {goal} |", flush=True)


if __name__ == "__main__":
    main()
