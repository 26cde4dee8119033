"""Command line: `toast-lab analyze|partition|demo|lab` on a built-in model or `module:function`.

Every mistake in what a user typed (a target without example arguments, a config key the
model does not take, a bad mesh, pin, device or output path) ends the command with one line,
`toast-lab: <what is wrong and how to fix it>`, on stderr and exit status 2, before any long
work starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import math
import os
import subprocess
import sys
import time
import warnings

EXIT_USAGE = 2  # the status of a command line that cannot run as typed (as argparse uses)


class UsageError(Exception):
    """A user's mistake on the command line: main() prints `toast-lab: <message>`, exits 2."""


def _is_count(text: str) -> bool:
    """A size typed as ASCII digits: `str.isdigit` also accepts '²', which `int` refuses."""
    text = text.strip()
    return text.isascii() and text.isdigit()


def _parse_config(items: list[str]) -> dict:
    """['layers=2', 'size=gpt2-small'] -> {'layers': 2, 'size': 'gpt2-small'}."""
    config = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"config entries look like -c key=value (e.g. -c layers=2), got "
                             f"{item!r}")
        key = key.strip()
        if raw.lower() in ("true", "false"):
            config[key] = raw.lower() == "true"
            continue
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
            raise UsageError(f"unknown model {target!r}; built-in models: "
                             f"{', '.join(zoo.names())}, or give package.module:function")
        _check_zoo_config(target, config)
        try:
            return zoo.get(target, **config)
        except Exception as err:  # a config value the model cannot build with, e.g. heads=0
            settings = " ".join(f"-c {k}={v}" for k, v in config.items())
            raise UsageError(f"building {target} {settings} failed: {type(err).__name__}: "
                             f"{_first_line(err)}") from None
    module_name, _, attr = target.partition(":")
    if not module_name or not attr or not attr.isidentifier():
        raise UsageError(f"{target!r}: give package.module:function, e.g. mypkg.train:step")
    if module_name.startswith("."):  # importlib needs a package to resolve it against
        raise UsageError(f"{target!r}: relative module names are not supported; give the full "
                         f"dotted name, e.g. mypkg.train:step")
    sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UsageError(f"cannot import {module_name!r}: {err}; run from the directory that "
                         f"holds it or install its package") from None
    except Exception as err:  # the module itself failed on import (SyntaxError, ...)
        raise UsageError(f"importing {module_name} failed: {type(err).__name__}: "
                         f"{_first_line(err)}{_user_frame(err)}") from None
    if not hasattr(module, attr):
        raise UsageError(f"module {module_name!r} has no attribute {attr!r}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise UsageError(f"{target} is a {type(fn).__name__}, not a function")
    example, source = getattr(fn, "example_args", None), f"{target}.example_args"
    if example is None:
        example, source = getattr(module, f"{attr}_args", None), f"{module_name}.{attr}_args"
    no_args = (f"{target} has no example arguments: give it an `example_args` attribute, "
               f"define `{attr}_args` in the module, or make it a factory returning (fn, args)")
    if example is not None:
        if config:
            raise UsageError(f"{target} takes its example arguments as they are: -c "
                             f"{next(iter(config))}=... has nothing to configure (drop -c, or "
                             f"make {attr} a factory taking keyword arguments)")
        try:
            args = example() if callable(example) else example
        except Exception as err:  # the user's callable failed: say where, in one line
            raise UsageError(f"{source}() failed: {type(err).__name__}: {_first_line(err)}"
                             f"{_user_frame(err)}") from None
        if not isinstance(args, (tuple, list)):
            raise UsageError(f"{target}'s example arguments must be a tuple of positional "
                             f"arguments, got {type(args).__name__}")
        return fn, tuple(args)
    _check_factory_config(target, fn, config, no_args)
    try:
        made = fn(**config)
    except TypeError as err:  # a step called without its arguments, or a bad config value
        raise UsageError(f"{no_args} (calling it as a factory failed: {err})") from None
    except Exception as err:  # the factory itself failed, e.g. on a config value
        raise UsageError(f"calling {target} as a factory failed: {type(err).__name__}: "
                         f"{_first_line(err)}{_user_frame(err)}") from None
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0])):
        raise UsageError(no_args)
    return made


def _check_zoo_config(name: str, config: dict) -> None:
    """Every key the model takes, with a value of its default's type."""
    from . import zoo

    fields = {f.name: f for f in dataclasses.fields(zoo.config(name))}
    defaults = zoo.config(name)
    for key, value in config.items():
        if key not in fields:
            raise UsageError(f"model {name!r} takes no config key {key!r}; its keys: "
                             f"{', '.join(fields)}")
        default = getattr(defaults, key)
        kind = type(default)
        if kind is tuple:  # e.g. mlp's hidden sizes: -c hidden=128 or -c hidden=128,64
            parts = str(value).split(",")
            if not all(_is_count(p) for p in parts):
                raise UsageError(f"-c {key}={value}: {name}'s {key!r} takes integers separated "
                                 f"by commas, e.g. -c {key}={','.join(map(str, default))}")
            config[key] = value = tuple(int(p) for p in parts)
        ok = (isinstance(value, bool) if kind is bool
              else isinstance(value, kind) and not isinstance(value, bool) if kind is int
              else isinstance(value, (int, float)) and not isinstance(value, bool)
              if kind is float else isinstance(value, str) if kind is str else True)
        if not ok:
            raise UsageError(f"-c {key}={value}: {name}'s {key!r} takes a{'n' * (kind is int)} "
                             f"{kind.__name__} (default {default!r})")
        if kind is int and value < 0:  # every int of a zoo config is a size or a count
            raise UsageError(f"-c {key}={value}: {name}'s {key!r} is a size or a count; give a "
                             f"non-negative int (default {default!r})")
        if kind is float and not math.isfinite(value):
            raise UsageError(f"-c {key}={value}: {name}'s {key!r} takes a finite number "
                             f"(default {default!r})")
    try:
        zoo.config(name, **config)
    except (TypeError, ValueError) as err:
        raise UsageError(str(err)) from None
    except ArithmeticError as err:  # a check dividing by a value given as 0, e.g. heads=0
        raise UsageError(f"{name} cannot be configured with "
                         f"{' '.join(f'-c {k}={v}' for k, v in config.items())}: "
                         f"{type(err).__name__}: {_first_line(err)}") from None


def _check_factory_config(target, fn, config, no_args) -> None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = [p.name for p in params if p.default is p.empty
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY)]
    if required and not set(required) <= set(config):
        raise UsageError(no_args)
    for key in config:
        if key not in names:
            raise UsageError(f"{target} takes no config key {key!r}; its keyword arguments: "
                             f"{', '.join(names) or '(none)'}")


def _trace_and_analyze(args, fn, fn_args):
    """(analysis, trace seconds, analysis seconds); a failure in the user's function or an
    unknown primitive under --strict is a one-line UsageError."""
    from . import UnknownPrimitiveError, analyze, trace

    t0 = time.perf_counter()
    try:
        prog = trace(fn, *fn_args)
    except Exception as err:  # the user's function failed to trace: say where, in one line
        raise UsageError(f"tracing {args.target} failed: {type(err).__name__}: "
                         f"{_first_line(err)}{_user_frame(err)}") from None
    t1 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        try:
            an = analyze(prog, group_layers=not args.no_group, strict=args.strict)
        except UnknownPrimitiveError as err:
            raise UsageError(f"{err} (drop --strict to analyse it conservatively)") from None
    return an, t1 - t0, time.perf_counter() - t1


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else ""


def _user_frame(err: Exception) -> str:
    """' (at file.py:12)': the last frame of the traceback outside JAX and toast-lab."""
    tb, where = err.__traceback__, ""
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if not any(part in path for part in (f"{os.sep}jax{os.sep}", f"{os.sep}toast_lab{os.sep}",
                                               f"{os.sep}flax{os.sep}", "importlib")):
            where = f" (at {path}:{tb.tb_lineno})"
        tb = tb.tb_next
    return where


def _analyze(args) -> int:
    fn, fn_args = load_target(args.target, _parse_config(args.config))
    an, trace_s, analyze_s = _trace_and_analyze(args, fn, fn_args)
    print(an.summary(max_classes=args.max_classes))
    print(f"\ntraced in {trace_s:.2f} s, analysed in {analyze_s:.3f} s")
    return 0


def _parse_mesh(text: str) -> dict[str, int]:
    """'data=4,model=2' -> {'data': 4, 'model': 2}."""
    axes: dict[str, int] = {}
    for part in text.split(","):
        name, sep, size = part.partition("=")
        name = name.strip()
        if not sep or not name or not _is_count(size) or int(size) < 1:
            raise UsageError(f"--mesh looks like data=4,model=2 (names and positive sizes), got "
                             f"{text!r}")
        if name in axes:
            raise UsageError(f"--mesh {text}: axis {name!r} appears twice; give each axis once, "
                             f"e.g. data=4,model=2")
        axes[name] = int(size)
    return axes


NO_AXES_WORDS = ("none", "replicated")  # --pin words for replicated, unless an axis is so named
RESOLUTION_WORDS = ("replicate",)       # a conflict's resolution besides keep_dim<K>


def _parse_pins(items: list[str], mesh_axes=()) -> dict:
    """['batch=data', 'mlp=data+model', 'seq@...=keep_dim2'] -> pins for search().

    A value is mesh axes joined by '+', or a conflict's resolution (keep_dim<K>, replicate),
    or replicated: empty, `none` or `replicated`. In brackets, `[none]`, `[data+model]` (or
    `[data,model]`), `[]`, it is always axis names, never a word: how to pin an axis of
    `mesh_axes` called `none` or `replicated`, which the bare word would leave ambiguous."""
    pins = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        if not sep or not name:
            raise UsageError(f"--pin looks like batch=data or mlp=data+model, got {item!r}")
        if name in pins:
            raise UsageError(f"--pin {name}=... is given twice; pin each decision once")
        bracketed = value.startswith("[") and value.endswith("]")
        if bracketed:
            parts = value[1:-1].replace(",", "+")
            axes = tuple(parts.split("+")) if parts else ()
        elif value.startswith("keep_") or value in RESOLUTION_WORDS:
            pins[name] = value  # a class reads it as one axis of that name (tl.search)
            continue
        elif value in NO_AXES_WORDS and value in mesh_axes:
            raise UsageError(f"--pin {item} is ambiguous: {value!r} is an axis of --mesh and "
                             f"also the word for replicated; write --pin '{name}=[{value}]' for "
                             f"the axis, or --pin {name}= to replicate")
        else:
            axes = () if value in ("",) + NO_AXES_WORDS else tuple(value.split("+"))
        if any(not a for a in axes):
            raise UsageError(f"--pin {item}: mesh axes are joined by '+', e.g. mlp=data+model")
        repeated = sorted({a for a in axes if axes.count(a) > 1})
        if repeated:
            raise UsageError(f"--pin {item}: axis {repeated[0]!r} is repeated; a dim is sharded "
                             f"over each mesh axis at most once")
        pins[name] = axes
    return pins


def _step_pins(items: list[str]) -> tuple[dict, list[str]]:
    """({"remat@<group>" or "pipeline@<group>": its value}, the other pins) from --pin items:
    remat@<layer group>=<policy>, pipeline@<scanned stack>=<mesh axis>:<stages> (or none)."""
    steps, rest = {}, []
    for item in items:
        name, sep, value = item.partition("=")
        kind = next((k for k in ("remat@", "pipeline@") if name.startswith(k)), None)
        if kind is None:
            rest.append(item)
            continue
        if not sep or not value or name == kind:
            example = "remat@block*=full" if kind == "remat@" else "pipeline@block=stage:4"
            raise UsageError(f"--pin {item}: a {kind[:-1]} pin looks like {kind}<layer group>="
                             f"<{'policy' if kind == 'remat@' else 'mesh axis>:<stages'}>, "
                             f"e.g. {example}")
        if name in steps:
            raise UsageError(f"--pin {name}=... is given twice; pin each decision once")
        steps[name] = value
    return steps, rest


def _with_step(plan, steps: dict, micro_batches: int | None, mesh) -> dict:
    """The step pins as the search takes them ({name: value}, stages as "stage:4",
    "stage:4x2" or "none"), each first tried on `plan` with `micro_batches` (None: the
    search's to choose): a UsageError naming the flag where the analysis or the mesh does not
    allow one."""
    from .plan import PlanError, parse_pipeline

    if micro_batches is not None and micro_batches != 1:
        try:
            plan = plan.with_micro_batches(micro_batches, pin=True)
        except PlanError as err:
            raise UsageError(f"--micro-batches {micro_batches}: {err}") from None
    pins = {}
    for name, value in steps.items():
        group = name.partition("@")[2]
        try:
            if name.startswith("remat@"):
                plan = plan.with_remat(group, value, pin=True)
                pins[name] = value
                continue
            stages = parse_pipeline(group, value, mesh)
            if stages is not None:
                staged = plan.with_pipeline(group, stages.axis, stages.stages, stages.schedule,
                                            chunks=stages.chunks)
                # a circular schedule's micro-batches are the search's to choose if not given
                if micro_batches is not None or not staged.step.refusal:
                    staged.validate(mesh)
            pins[name] = "none" if stages is None else str(stages)
        except (PlanError, ValueError) as err:
            raise UsageError(f"--pin {name}={value}: {err}") from None
    return pins


def _pipeline_lines(plan, estimate) -> list[str]:
    """A pipelined plan's stages in words: how they cut the stack, the bubble of its schedule
    and the hand-offs between stages (the estimate's collective-permutes)."""
    p = plan.step.pipeline
    if p is None:
        return []
    m = plan.step.micro_batches
    layers = next(g.layers for g in plan.analysis.layer_groups if g.name == p.group)
    ticks = p.chunks * m + p.stages - 1
    runs = (f" ({p.chunks} runs of {layers // (p.stages * p.chunks)} round the stages)"
            if p.chunks > 1 else "")
    lines = [f"pipeline@{p.group}: {p.stages} stages over mesh axis {p.axis!r}, "
             f"{layers // p.stages} of {layers} layers each{runs}; {m} micro-batch"
             f"{'es' if m > 1 else ''}, {p.schedule}: "
             f"bubble {p.stages - 1}/{ticks} = {p.bubble(m):.0%} of each loop"]
    hand = estimate.collectives.get(("collective-permute", (p.axis,)))
    if hand is not None and hand.count:
        from .plan import format_bytes

        lines.append(f"  hand-offs: {hand.count:.0f} collective-permutes over {p.axis!r} per "
                     f"step, {format_bytes(hand.bytes / hand.count)} and "
                     f"{hand.time_s / hand.count * 1e6:.1f} us each")
    return lines


def _check_out(path: str | None, force: bool = False) -> None:
    """Fails before the search, not after it, when the plan could not be written: where it
    cannot be written at all, or would replace a file that is not a plan file (a user's
    train.py) without --force."""
    from .plan import PLAN_FILE, is_plan_file, replace_refusal

    if path is None:
        return
    _check_file("--out", path, "plan.json")
    if not force:
        why = replace_refusal(path, is_plan_file, PLAN_FILE,
                              "pass --force to replace it, or choose another name")
        if why is not None:
            raise UsageError(f"--out {why}")


def _check_file(flag: str, path: str, example: str) -> None:
    """A file `path` can be written: its directory exists and is writable, and `path` does
    not name a directory (one that exists, or one ending in a separator)."""
    if not path.strip():
        raise UsageError(f"{flag} {path!r}: give a file name, e.g. {flag} {example}")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a directory; give a file name, e.g. "
                         f"{os.path.join(path, example)}")
    if path.endswith((os.sep, "/")):  # 'plans/' means a directory, not a file named 'plans'
        raise UsageError(f"{flag} {path}: directory {path!r} does not exist; create it first "
                         f"and give a file name, e.g. {os.path.join(path, example)}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"{flag} {path}: directory {parent!r} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{flag} {path}: cannot write in {parent!r}")


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


def _estimate_row(name: str, est, width: int = 12, cap: float | None = None) -> str:
    """One plan's line of the partition table; fits: under `cap` bytes (None: the device's
    memory)."""
    from .plan import format_bytes

    fits = est.feasible if cap is None else est.peak_memory_bytes <= cap
    return (f"  {name:<{width}} {est.step_time_s * 1e3:11.3f} {est.compute_s * 1e3:11.3f} "
            f"{est.communication_s * 1e3:11.3f} {format_bytes(est.peak_memory_bytes):>11}  "
            f"{'yes' if fits else 'NO'}")


def _mesh(args):
    from . import Mesh, devices

    axes = _parse_mesh(args.mesh)
    try:
        return Mesh(axes, device=args.device)
    except (KeyError, ValueError, TypeError) as err:
        known = ", ".join(getattr(d, "name", str(d)) for d in devices())
        message = err.args[0] if err.args else str(err)
        if "device" in str(message).lower() or args.device not in known:
            raise UsageError(f"--device {args.device}: no such device preset; choose one of "
                             f"{known}") from None
        raise UsageError(str(message)) from None


def _partition(args) -> int:
    from . import estimate, search, strategies
    from .plan import PlanError

    mesh = _mesh(args)
    steps, class_pins = _step_pins(args.pin)
    pins = _parse_pins(class_pins, mesh.axis_names)
    _check_out(args.out, args.force)
    # argparse's float() takes 'inf', 'nan' and 1e400 (inf): the search needs finite numbers
    if not (math.isfinite(args.budget) and args.budget > 0):
        raise UsageError(f"--budget {args.budget}: give a finite, positive number of seconds, "
                         f"e.g. --budget 30")
    if args.memory_cap is not None and not (math.isfinite(args.memory_cap)
                                            and args.memory_cap > 0):
        raise UsageError(f"--memory-cap {args.memory_cap}: give a finite, positive number of "
                         f"bytes per device, e.g. --memory-cap {16 * 2**30} (16 GiB)")
    if args.seed < 0:  # numpy's default_rng refuses negative seeds
        raise UsageError(f"--seed {args.seed}: give a non-negative integer")
    fn, fn_args = load_target(args.target, _parse_config(args.config))
    an, trace_s, analyze_s = _trace_and_analyze(args, fn, fn_args)
    print(f"{an.program.fn_name}: {len(an.program.ops)} ops, {len(an.classes)} classes, "
          f"{len(an.conflicts)} conflicts (analysed in {trace_s + analyze_s:.2f} s); mesh {mesh}")
    from .plan import Plan

    # refused before the search; it decides remat, micro-batches and stages with the
    # sharding, around these pins
    pins.update(_with_step(Plan.replicated(an), steps, args.micro_batches, mesh))
    if args.micro_batches is not None:
        pins["micro_batches"] = args.micro_batches
    try:
        result = search(an, mesh, pins=pins, budget_s=args.budget,
                        seed=args.seed, memory_cap=args.memory_cap,
                        callback=_ProgressBar(args.budget))
    except PlanError as err:
        raise UsageError(str(err)) from None
    experts = strategies.expert(an, mesh, memory_cap=args.memory_cap)
    width = max(12, *map(len, experts))
    print(f"\n  {'plan':<{width}} {'step (ms)':>11} {'compute':>11} {'comm':>11} "
          f"{'peak':>11}  fits")
    for name, plan in experts.items():
        print(_estimate_row(name, estimate(an, plan, mesh), width, args.memory_cap))
    if result.plan is None:
        print(f"\n{result.message}")
        return 1
    print(_estimate_row("search", result.estimate, width, args.memory_cap))
    plan = result.plan
    print(f"\nsearch: {result.message}\nplan: {plan!r}")
    if not plan.step.is_default:
        print(f"decisions beyond sharding: {plan.step} (plan.jit rewrites the step so; "
              f"tl.verify measures it)")
        for line in _pipeline_lines(plan, result.estimate):
            print(line)
    if args.out:
        try:
            path = plan.save(args.out, mesh=mesh, estimate=result.estimate.to_dict(),
                                    overwrite=args.force)
        except FileExistsError:  # a file put there during the search
            _check_out(args.out)  # says what it is and how to replace it
            raise UsageError(f"--out {args.out}: a file appeared there during the search; pass "
                             f"--force to replace it") from None
        except OSError as err:  # checked before the search; the disk can still refuse it
            raise UsageError(f"--out {args.out}: cannot write the plan: "
                             f"{err.strerror or err}") from None
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
    args.budget, args.memory_cap, args.out, args.force = 3.0, None, None, False
    args.micro_batches = None
    return _partition(args)


def lab_notebook(target: str, config: dict, mesh: dict[str, int], device: str) -> dict:
    """A notebook (nbformat 4) that runs top to bottom: it builds the Lab on `target` and shows
    it, then exports the plan, runs the step sharded by it (`plan.jit`) on the example
    arguments, and checks it against the unsharded step (`tl.verify`)."""
    axes = ", ".join(f"{a!r}: {n}" for a, n in mesh.items())
    devices = math.prod(mesh.values())
    kwargs = ", ".join(f"{k}={v!r}" for k, v in config.items())
    name = target.replace(":", "-").replace(".", "-")
    if ":" in target:
        load = (f"from toast_lab.cli import load_target\n"
                f"fn, args = load_target({target!r}, {config!r})")
        example = ("example = tl.verification.concrete_args(args)  # arrays where the example "
                   "arguments are shapes")
    else:
        load = f"fn, args = tl.zoo.get({target!r}{', ' if kwargs else ''}{kwargs})"
        example = (f"example = tl.zoo.sample({target!r}{', ' if kwargs else ''}{kwargs})"
                   f"  # initialized weights, a random batch")
    first = (
        f"import os\n\n"
        f"# the step below runs on {devices} devices: simulated on the CPU where the machine has "
        f"fewer\n"
        f"if \"xla_force_host_platform_device_count\" not in os.environ.get(\"XLA_FLAGS\", \"\"):\n"
        f"    os.environ[\"XLA_FLAGS\"] = (os.environ.get(\"XLA_FLAGS\", \"\") + "
        f"\" --xla_force_host_platform_device_count={devices}\").strip()\n\n"
        f"import jax\nimport toast_lab as tl\n\n{load}\n"
        f"mesh = tl.Mesh({{{axes}}}, device={device!r})\n"
        f"lab = tl.Lab(fn, *args, mesh=mesh)\nlab")
    notes = ("# toast-lab: the Lab\n\n"
             "Run the cell below (Shift+Enter). The graph is the program collapsed by name "
             "scope, coloured by sharding-equivalence class; pick axes for a class or a "
             "resolution for a conflict to pin it, run the search, and export the plan. The same "
             "from Python: `lab.pin(\"batch\", \"data\")`, `lab.search(budget_s=30)`, "
             "`lab.stop()`, `lab.export(\"plan.json\")`, `lab.plan`, `lab.estimate`.")
    run_notes = ("## Run the plan\n\n"
                 "Once the plan is the one you want: save it, run the training step sharded by "
                 "it (`plan.jit`: `jax.jit` with the plan's shardings and constraints) on the "
                 "example arguments, and check it against the unsharded step (`tl.verify` "
                 "compiles it with XLA on simulated CPU devices, compares every output and "
                 "lists the collectives XLA inserted). On a CPU this takes a while for a large "
                 "model.")
    export = (f"lab.stop()  # a running search ends here, keeping its best plan\n"
              f"plan = lab.plan\n"
              f"path = lab.export({f'toast-lab-{name}.plan.json'!r})  # replaces only a plan file\n"
              f"print(f\"wrote {{path}}: {{plan!r}}\")")
    run = (f"{example}\n"
           f"devices = jax.devices() if jax.device_count() >= mesh.size else jax.devices(\"cpu\")\n"
           f"step = plan.jit(fn, mesh.jax_mesh(devices), donate=False)  # donate=False keeps "
           f"`example` for verify\n"
           f"out = jax.block_until_ready(step(*example))\n"
           f"print(f\"the step ran sharded over {{mesh.size}} devices (output arrays: "
           f"{{len(jax.tree.leaves(out))}})\")")
    verify = ("report = tl.verify(fn, example, plan, mesh, estimate=lab.estimate)\n"
              "print(report)")

    return _notebook([("markdown", notes), ("code", first), ("code", "lab.plan, lab.estimate"),
                      ("markdown", run_notes), ("code", export), ("code", run),
                      ("code", verify)])


def _notebook(cells: list[tuple[str, str]]) -> dict:
    """An nbformat 4.5 notebook of (cell type, source) pairs, for the python3 kernel."""

    def cell(i, kind, text):
        c = {"cell_type": kind, "id": f"toast-lab-{i}", "metadata": {},
             "source": text.splitlines(keepends=True)}
        if kind == "code":
            c.update(execution_count=None, outputs=[])
        return c
    return {"cells": [cell(i, kind, text) for i, (kind, text) in enumerate(cells)],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                        "name": "python3"},
                         "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def _lab(args) -> int:
    config = _parse_config(args.config)
    if args.target == "gpt" and "size" not in config:
        config = {"size": "gpt2-small", **config}
    if ":" not in args.target:  # a zoo model: check its name and config before writing
        from . import zoo

        if args.target not in zoo.names():
            raise UsageError(f"unknown model {args.target!r}; built-in models: "
                             f"{', '.join(zoo.names())}, or give package.module:function")
        _check_zoo_config(args.target, config)
    else:  # import it and find its example arguments, as partition does; no tracing (slow)
        load_target(args.target, config)
    mesh = _mesh(args).shape  # a bad mesh or device is a usage error here, not in the notebook
    name = args.target.replace(":", "-").replace(".", "-")
    path = args.notebook or f"toast-lab-{name}.ipynb"
    if os.path.isfile(path):
        print(f"toast-lab: opening the existing notebook {path} (delete it for a fresh one)")
    else:
        _check_file("--notebook", path, f"toast-lab-{name}.ipynb")
        from .plan import write_file

        text = json.dumps(lab_notebook(args.target, config, mesh, args.device), indent=1)
        try:  # atomic, and never over a file: an existing notebook is opened above
            write_file(path, text + "\n", kind="file toast-lab may replace",
                       fix="pass another --notebook")
        except OSError as err:
            raise UsageError(f"--notebook {path}: cannot write it: {err.strerror or err}") from None
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


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in the one-line form of every other usage error."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"toast-lab: {message} (see {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
    """Runs the command; a usage error prints one line and raises SystemExit(2)."""
    parser = _Parser(prog="toast-lab", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
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
        p.add_argument("--no-group", action="store_true",
                       help="one decision per layer: do not group repeated layers")
        p.add_argument("--strict", action="store_true",
                       help="fail on primitives without a sharding rule (and on rules that "
                            "cannot map an op) instead of analysing them conservatively")
        if name != "partition":  # partition prints no class table
            p.add_argument("--max-classes", type=int, default=40,
                           help="rows of the class table (the largest classes first)")
        if name == "partition":
            p.add_argument("--mesh", default="data=8", help="mesh axes, e.g. data=4,model=2")
            p.add_argument("--device", default="h100", help="device preset (toast_lab.devices())")
            p.add_argument("--budget", type=float, default=10.0, help="search seconds")
            p.add_argument("--seed", type=int, default=0)
            p.add_argument("--memory-cap", type=float, default=None,
                           help="bytes per device (default: the device's memory)")
            p.add_argument("--pin", action="append", default=[], metavar="NAME=AXES",
                           help="fix a decision: batch=data, mlp=data+model, batch= (or none, "
                                "replicated) for replicated, <conflict>=keep_dim2, "
                                "<class>@optimizer=data, remat@<layer group>=full (or "
                                "dots_with_no_batch_dims, everything), pipeline@<scanned "
                                "stack>=stage:4 (stages over a mesh axis) or =none; '[...]' is "
                                "always axis names: 'batch=[none]' pins an axis called none")
            p.add_argument("--micro-batches", type=int, default=None, metavar="K",
                           help="split the batch into K micro-batches, accumulating the "
                                "gradients before one update (where the step allows it); "
                                "default: the search decides")
            p.add_argument("--out", default=None,
                           help="write the plan as JSON here (it replaces an earlier plan file; "
                                "any other file only with --force)")
            p.add_argument("--force", action="store_true",
                           help="let --out replace a file that is not a plan file")
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
    if getattr(args, "max_classes", 1) < 1:
        parser.error(f"--max-classes {args.max_classes}: give a positive number of rows")
    try:
        return {"analyze": _analyze, "partition": _partition, "demo": _demo,
                "lab": _lab}[args.command](args)
    except UsageError as err:
        parser.exit(EXIT_USAGE, f"toast-lab: {err}\n")


if __name__ == "__main__":
    sys.exit(main())
