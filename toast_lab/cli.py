"""Command line: `toast-lab analyze|demo` on a built-in model or `module:function`."""

from __future__ import annotations

import argparse
import importlib
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


def _demo(args) -> int:
    print("toast-lab demo: the built-in GPT training step (2 layers), traced and analysed\n")
    args.target, args.config = "gpt", ["layers=2"] + args.config
    return _analyze(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toast-lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("analyze", "print the sharding-equivalence classes and conflicts"),
                            ("demo", "analyse the built-in GPT")):
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
    args = parser.parse_args(argv)
    return {"analyze": _analyze, "demo": _demo}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
