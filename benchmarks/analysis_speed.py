"""Trace and analysis time of the GPT training step at GPT-2-small width, by depth.

    python benchmarks/analysis_speed.py [--layers 2 12 24 48] [--repeat 3]

Analysis time excludes JAX's own tracing (`make_jaxpr`), which is reported separately as
"trace"; "eqn/s" is equations analysed per second. Goal: 24 layers under 1 s, growing
linearly with depth. The last line times the rule table alone (`rules.rule_for` on every op of
the 2-layer program, no analysis cache): rules run once per op of programs with 10,000+ ops, so
they must stay in the microseconds.
"""

from __future__ import annotations

import argparse
import time

import toast_lab as tl


def measure(layers: int, repeat: int) -> dict:
    fn, args = tl.zoo.get("gpt", size="gpt2-small", layers=layers)
    t0 = time.perf_counter()
    prog = tl.trace(fn, *args)
    trace_s = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        an = tl.analyze(prog, group_layers=True)
        best = min(best, time.perf_counter() - t0)
    return dict(layers=layers, ops=len(prog.ops), values=len(prog.values), trace_s=trace_s,
                analyze_s=best, eqn_per_s=len(prog.ops) / best, classes=len(an.classes),
                conflicts=len(an.conflicts))


def rule_calls_per_s(seconds: float = 1.0) -> tuple[float, int]:
    fn, args = tl.zoo.get("gpt", size="gpt2-small", layers=2)
    prog = tl.trace(fn, *args)
    calls = []
    for op in prog.ops:
        if op.body or not tl.rules.has_rule(op.primitive):
            continue
        ins = tuple(prog.values[v].shape for v in op.operands)
        outs = tuple(prog.values[v].shape for v in op.results)
        calls.append((op.primitive, ins, outs, op.params))
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for name, ins, outs, params in calls:
            tl.rules.rule_for(name, ins, outs, params)
        n += len(calls)
    return n / (time.perf_counter() - start), len(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 12, 24, 48])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| layers | equations | values | trace (s) | analyze (s) | eqn/s | classes | conflicts |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layers in args.layers:
        r = measure(layers, args.repeat)
        print(f"| {r['layers']} | {r['ops']:,} | {r['values']:,} | {r['trace_s']:.2f} | "
              f"{r['analyze_s']:.3f} | {r['eqn_per_s']:,.0f} | {r['classes']} | "
              f"{r['conflicts']} |", flush=True)
    rate, n = rule_calls_per_s()
    print(f"\nrule table: {rate:,.0f} rule_for calls/s ({1e6 / rate:.1f} µs each) over the "
          f"{n} ops of the 2-layer program")


if __name__ == "__main__":
    main()
