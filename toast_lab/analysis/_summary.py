"""Analysis.summary(): the classes and conflicts as a readable text table."""

from __future__ import annotations


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f}"


def summary_text(an, max_classes: int = 40) -> str:
    prog = an.program
    lines = [
        f"{prog.fn_name}: {len(prog.ops)} ops, {len(prog.inputs)} inputs, "
        f"{len(an.classes)} sharding-equivalence classes, {len(an.conflicts)} conflicts"
        + (" (layers grouped)" if an.grouped else ""),
    ]
    if an.fallback_ops:
        lines.append("  ops analysed conservatively (every dim needs replication):")
        first: dict[str, tuple[int, int]] = {}
        for o in an.fallback_ops:
            prim = prog.ops[o].primitive
            k, _ = first.get(prim, (o, 0))
            first[prim] = (k, first.get(prim, (o, 0))[1] + 1)
        for prim, (o, count) in sorted(first.items()):
            why = an.op_rules[o].reason
            why = f"rule failed: {why}" if why else "no rule"
            lines.append(f"    {prim} x{count} ({why}), first at {prog.ops[o].source}")
    ranked = sorted(an.classes, key=lambda c: (-c.bytes, c.id))
    shown = ranked[:max_classes]
    # Names are shown whole (the column is as wide as the longest): a cut name is unreadable
    # and, with long library paths, no longer unique.
    names = [c.name if not c.aliases else f"{c.name} ({'/'.join(c.aliases[:2])})"
             for c in shown]
    width = max([22, *map(len, names)])
    lines += ["", "classes (by bytes at stake):",
              f"  {'id':>4}  {'name':<{width}} {'size':>7} {'dims':>6} {'values':>6} "
              f"{'MiB':>10} {'layers':>6}  first seen"]
    for c, name in zip(shown, names):
        lines.append(f"  {c.id:>4}  {name:<{width}} {c.size:>7} {len(c.members):>6} "
                     f"{c.num_values:>6} {_mib(c.bytes):>10} {c.layers:>6}  {c.origin}")
    if len(ranked) > len(shown):
        rest = ranked[len(shown):]
        lines.append(f"  ... {len(rest)} more classes ({_mib(sum(c.bytes for c in rest))} MiB)")
    if an.conflicts:
        lines += ["", "conflicts:"]
        for c in an.conflicts:
            site = prog.values[c.site_value]
            layers = f", {c.layers} layers" if c.layers > 1 else ""
            lines.append(f"  #{c.id} {c.class_name!r} twice in {site.dtype.name}"
                         f"{list(site.shape)} at {c.where} ({c.source or 'argument'}): "
                         f"{len(c.values)} values{layers}")
            names = an.dim_names(c.site_value)
            lines.append(f"      site dims: [{', '.join(n or '1' for n in names)}]; "
                         f"resolutions: {', '.join(c.resolutions)}")
    return "\n".join(lines)
