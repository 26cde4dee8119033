"""Command line: `toast-lab analyze|partition|demo|lab` on a built-in model or `module:function`."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
import warnings


def _parse_config(items: list[str]) -> dict:
    """['layers=2', 'size=gpt2-small'] -> {'layers': 2, 'size': 'gpt2-small'}."""
    config = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"toast-lab: config entries look like key=value, got {item!r}")
        for cast in (int, float):
            try:
                config[key] = cast(raw)
                break
            except ValueError:
                continue
        else:
            config[key] = raw
    return config


def load_target(target: str, config: dict):
    """(fn, args) for a zoo model name or `package.module:function`.

    For `module:function`, the function needs example arguments: either the function has an
    `example_args` attribute (a tuple, or a callable returning one), or the module defines
    `<function>_args` likewise; or `function` is itself a factory returning `(fn, args)` when
    called with the config as keyword arguments.
    """
    from . import zoo

    if ":" not in target:
        if target not in zoo.names():
            raise SystemExit(f"toast-lab: unknown model {target!r}; built-in models: "
                             f"{', '.join(zoo.names())}, or give package.module:function")
        return zoo.get(target, **config)
    module_name, _, attr = target.partition(":")
    sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise SystemExit(f"toast-lab: cannot import {module_name!r}: {err}") from None
    if not hasattr(module, attr):
        raise SystemExit(f"toast-lab: module {module_name!r} has no attribute {attr!r}")
    fn = getattr(module, attr)
    example = getattr(fn, "example_args", None)
    if example is None:
        example = getattr(module, f"{attr}_args", None)
    if example is None:
        made = fn(**config)
        if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0])):
            raise SystemExit(f"toast-lab: {target} has no example arguments: give it an "
                             f"`example_args` attribute, define `{attr}_args` in the module, or "
                             f"make it a factory returning (fn, args)")
        return made
    return fn, (example() if callable(example) else example)


def _analyze(args) -> int:
    from . import analyze, trace

    fn, fn_args = load_target(args.target, _parse_config(args.config))
    t0 = time.perf_counter()
    prog = trace(fn, *fn_args)
    t1 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        an = analyze(prog, group_layers=not args.no_group, strict=args.strict)
    t2 = time.perf_counter()
    print(an.summary(max_classes=args.max_classes))
    print(f"\ntraced in {t1 - t0:.2f} s, analysed in {t2 - t1:.3f} s")
    return 0


def _parse_mesh(text: str) -> dict[str, int]:
    """'data=4,model=2' -> {'data': 4, 'model': 2}."""
    axes = {}
    for part in text.split(","):
        name, sep, size = part.partition("=")
        if not sep or not size.strip().isdigit():
            raise SystemExit(f"toast-lab: --mesh looks like data=4,model=2, got {text!r}")
        axes[name.strip()] = int(size)
    return axes


def _parse_pins(items: list[str]) -> dict:
    """['batch=data', 'mlp=data+model', 'seq@...=keep_dim2'] -> pins for search()."""
    pins = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        if not sep:
            raise SystemExit(f"toast-lab: --pin looks like batch=data or mlp=data+model, got "
                             f"{item!r}")
        pins[name] = value if value.startswith("keep_") or value == "replicate" else (
            () if value in ("", "none", "replicated") else tuple(value.split("+")))
    return pins


class _ProgressBar:
    """A one-line progress bar on stderr, fed by search()'s callback."""

    def __init__(self, budget_s: float):
        self.budget_s = budget_s

    def __call__(self, p) -> None:
        frac = min(1.0, p.elapsed_s / self.budget_s) if self.budget_s else 1.0
        bar = "#" * int(30 * frac)
        best = (f"{p.estimate.step_time_s * 1e3:9.3f} ms, "
                f"{p.estimate.peak_memory_bytes / 2**30:6.2f} GiB" if p.estimate else "none fits")
        sys.stderr.write(f"\r  search [{bar:<30}] {p.simulations:7d} plans "
                         f"{p.sims_per_s:7.0f}/s  best {best}")
        if p.done:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _estimate_row(name: str, est) -> str:
    return (f"  {name:<12} {est.step_time_s * 1e3:11.3f} {est.compute_s * 1e3:11.3f} "
            f"{est.communication_s * 1e3:11.3f} {est.peak_memory_bytes / 2**30:9.2f}  "
            f"{'yes' if est.feasible else 'NO'}")


def _partition(args) -> int:
    from . import Mesh, analyze, estimate, search, strategies, trace
    from .plan import PlanError

    fn, fn_args = load_target(args.target, _parse_config(args.config))
    mesh = Mesh(_parse_mesh(args.mesh), device=args.device)
    t0 = time.perf_counter()
    an = analyze(trace(fn, *fn_args))
    t1 = time.perf_counter()
    print(f"{an.program.fn_name}: {len(an.program.ops)} ops, {len(an.classes)} classes, "
          f"{len(an.conflicts)} conflicts (analysed in {t1 - t0:.2f} s); mesh {mesh}")
    try:
        result = search(an, mesh, pins=_parse_pins(args.pin), budget_s=args.budget,
                        seed=args.seed, memory_cap=args.memory_cap,
                        callback=_ProgressBar(args.budget))
    except PlanError as err:
        raise SystemExit(f"toast-lab: {err}") from None
    experts = strategies.expert(an, mesh)
    print(f"\n  {'plan':<12} {'step (ms)':>11} {'compute':>11} {'comm':>11} {'peak GiB':>9}  fits")
    for name, plan in experts.items():
        print(_estimate_row(name, estimate(an, plan, mesh)))
    if result.plan is None:
        print(f"\n{result.message}")
        return 1
    print(_estimate_row("search", result.estimate))
    print(f"\nsearch: {result.message}\nplan: {result.plan!r}")
    if args.out:
        path = result.plan.save(args.out, mesh=mesh, estimate=result.estimate.to_dict())
        print(f"wrote {path}")
    return 0


def _demo(args) -> int:
    print("toast-lab demo: the built-in GPT training step (2 layers), traced, analysed and "
          "partitioned for a data=4 x model=2 mesh of H100s\n")
    args.target, args.config = "gpt", ["layers=2", "size=gpt2-small"] + args.config
    code = _analyze(args)
    if code:
        return code
    print()
    args.mesh, args.device, args.pin, args.seed = "data=4,model=2", "h100", [], 0
    args.budget, args.memory_cap, args.out = 3.0, None, None
    return _partition(args)


def lab_notebook(target: str, config: dict, mesh: dict[str, int], device: str) -> dict:
    """A notebook (nbformat 4) whose first cell builds the Lab on `target` and shows it."""
    axes = ", ".join(f"{a!r}: {n}" for a, n in mesh.items())
    kwargs = ", ".join(f"{k}={v!r}" for k, v in config.items())
    if ":" in target:
        load = (f"from toast_lab.cli import load_target\n"
                f"fn, args = load_target({target!r}, {config!r})")
    else:
        load = f"fn, args = tl.zoo.get({target!r}{', ' if kwargs else ''}{kwargs})"
    first = (f"import toast_lab as tl\n\n{load}\n"
             f"lab = tl.Lab(fn, *args, mesh=tl.Mesh({{{axes}}}, device={device!r}))\nlab")
    notes = ("# toast-lab: the Lab\n\n"
             "Run the cell below (Shift+Enter). The graph is the program collapsed by name "
             "scope, coloured by sharding-equivalence class; pick axes for a class or a "
             "resolution for a conflict to pin it, run the search, and export the plan. The same "
             "from Python: `lab.pin(\"batch\", \"data\")`, `lab.search(budget_s=30)`, "
             "`lab.stop()`, `lab.export(\"plan.json\")`, `lab.plan`, `lab.estimate`.")
    def cell(kind, text):
        c = {"cell_type": kind, "metadata": {}, "source": text.splitlines(keepends=True)}
        if kind == "code":
            c.update(execution_count=None, outputs=[])
        return c
    return {"cells": [cell("markdown", notes), cell("code", first),
                      cell("code", "lab.plan, lab.estimate")],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                        "name": "python3"},
                         "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def _lab(args) -> int:
    config = _parse_config(args.config)
    if args.target == "gpt" and "size" not in config:
        config = {"size": "gpt2-small", **config}
    mesh = _parse_mesh(args.mesh)
    name = args.target.replace(":", "-").replace(".", "-")
    path = args.notebook or f"toast-lab-{name}.ipynb"
    if os.path.exists(path):
        print(f"toast-lab: opening the existing notebook {path} (delete it for a fresh one)")
    else:
        with open(path, "w") as f:
            json.dump(lab_notebook(args.target, config, mesh, args.device), f, indent=1)
        print(f"toast-lab: wrote {path}")
    cmd = [sys.executable, "-m", "jupyterlab", path]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # JupyterLab refuses root unless told (containers run so)
    if args.no_browser:
        cmd.append("--no-browser")
    cmd += args.jupyter_args
    if args.no_launch:
        print(" ".join(cmd))
        return 0
    try:
        return subprocess.call(cmd)
    except FileNotFoundError:
        raise SystemExit("toast-lab: JupyterLab is not installed here; `python -m pip install "
                         "toast-lab` installs it") from None
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toast-lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("analyze", "print the sharding-equivalence classes and conflicts"),
                            ("partition", "search a plan for a mesh and compare it with the "
                                          "expert strategies"),
                            ("demo", "analyse and partition the built-in GPT")):
        p = sub.add_parser(name, help=help_text)
        if name != "demo":
            p.add_argument("target", help="a built-in model (gpt, gpt_scan, mlp, cnn, moe, gnn) "
                                          "or package.module:function")
        p.add_argument("-c", "--config", action="append", default=[], metavar="KEY=VALUE",
                       help="model config, e.g. -c layers=12 -c size=gpt2-small")
        p.add_argument("--no-group", action="store_true", help="do not group repeated layers")
        p.add_argument("--strict", action="store_true",
                       help="fail on primitives without a sharding rule")
        p.add_argument("--max-classes", type=int, default=40)
        if name == "partition":
            p.add_argument("--mesh", default="data=8", help="mesh axes, e.g. data=4,model=2")
            p.add_argument("--device", default="h100", help="device preset (toast_lab.devices())")
            p.add_argument("--budget", type=float, default=10.0, help="search seconds")
            p.add_argument("--seed", type=int, default=0)
            p.add_argument("--memory-cap", type=float, default=None,
                           help="bytes per device (default: the device's memory)")
            p.add_argument("--pin", action="append", default=[], metavar="NAME=AXES",
                           help="fix a decision: batch=data, mlp=data+model, <conflict>=keep_dim2")
            p.add_argument("--out", default=None, help="write the plan as JSON here")
    p = sub.add_parser("lab", help="open JupyterLab on a notebook with the Lab (the widget) "
                                   "for a model")
    p.add_argument("target", nargs="?", default="gpt",
                   help="a built-in model (default gpt, GPT-2-small) or package.module:function")
    p.add_argument("-c", "--config", action="append", default=[], metavar="KEY=VALUE",
                   help="model config, e.g. -c layers=24")
    p.add_argument("--mesh", default="data=4,model=2", help="mesh axes, e.g. data=4,model=2")
    p.add_argument("--device", default="h100", help="device preset (toast_lab.devices())")
    p.add_argument("--notebook", default=None,
                   help="the notebook to write (if absent) and open; default "
                        "toast-lab-<model>.ipynb in the current directory")
    p.add_argument("--no-browser", action="store_true", help="passed on to jupyter lab")
    p.add_argument("--no-launch", action="store_true",
                   help="write the notebook and print the jupyter command, without running it")
    p.epilog = "Other options go to jupyter lab, e.g. `toast-lab lab -- --port 8890`."
    argv = sys.argv[1:] if argv is None else list(argv)
    passthrough: list[str] = []
    if "--" in argv:  # what follows goes to jupyter lab
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if passthrough and args.command != "lab":
        parser.error(f"unrecognized arguments: -- {' '.join(passthrough)}")
    args.jupyter_args = passthrough
    return {"analyze": _analyze, "partition": _partition, "demo": _demo,
            "lab": _lab}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
