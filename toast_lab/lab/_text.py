"""The view model as text: what tests read and what a terminal (or `repr`) shows."""

from __future__ import annotations

AT_STAKE = ("at stake: the bytes of the values whose layout the decision changes, summed over "
            "the step (not memory held at once)")


def _ms(s) -> str:
    return "-" if s is None else f"{s * 1e3:.3f} ms"


def _gib(b) -> str:
    return "-" if b is None else f"{b / 2**30:.2f} GiB"


def _choice(ch) -> str:
    mark = "*" if ch.current else ("x" if not ch.valid else " ")
    price = f" {_ms(ch.step_time_s)} {_gib(ch.peak_memory_bytes)}" if ch.valid else ""
    why = f" ({ch.reason})" if ch.reason else ""
    return f"{mark}{ch.label}{price}{why}"


def render(vm) -> str:
    p, m, est = vm.program, vm.mesh, vm.estimate
    mesh = "×".join(f"{a}={n}" for a, n in m["axes"].items()) + f" on {m['device']}" if m else "-"
    lines = [f"{p['name']}: {p['ops']} ops; mesh {mesh}"]
    if est:
        lines.append(f"estimate: step {_ms(est['step_time_s'])} (compute "
                     f"{_ms(est['compute_s'])}, communication {_ms(est['communication_s'])}); "
                     f"peak {_gib(est['peak_memory_bytes'])} of "
                     f"{_gib(est['memory_capacity_bytes'])}: "
                     f"{'fits' if est['feasible'] else 'DOES NOT FIT'}")
        by_axis = ", ".join(f"{a} {_ms(t)}" for a, t in est["communication_by_axis"].items())
        if by_axis:
            lines.append(f"  communication by axis: {by_axis}")
    if vm.pricing:
        lines.append(f"pricing: {vm.pricing}; every price is pending")
    if vm.memory is not None:
        lines.append(_memory(vm.memory))
    if vm.start:
        lines.append(f"{vm.start.label} ({vm.start.note})")
    if vm.error:
        lines.append(f"error: {vm.error}")
    if vm.notice:
        lines.append(f"notice: {vm.notice}")
    if vm.steps:
        lines.append("step (remat, micro-batches, pipeline stages):")
    for d in vm.steps:
        lines.append(f"  {d.name} ({d.label}): {d.value}{' pinned' if d.pinned else ''}")
        lines.append("      " + " | ".join(_choice(ch) for ch in d.choices))
    if vm.schedule is not None:
        lines += schedule_lines(vm.schedule)
    lines.append(f"classes ({AT_STAKE}):")
    for c in vm.classes:
        pin = " pinned" if c.pinned else ""
        axes = "×".join(c.axes) or "replicated"
        tags = "".join(t for t, on in ((" legend", c.legend), (" minor", c.minor)) if on)
        lines.append(f"  #{c.id} {c.name:<12} size {c.size:<6} {c.bytes / 2**20:12,.1f} MiB "
                     f"at stake {c.color} {axes}{pin}{tags}")
        lines.append("      " + " | ".join(_choice(ch) for ch in c.choices))
    if vm.conflicts:
        lines.append("conflicts:")
    for c in vm.conflicts:
        state = c.label if c.active else "inactive (its class is replicated: no cost)"
        lines.append(f"  #{c.id} {c.name}: {state}{' pinned' if c.pinned else ''}")
        lines.append("      " + " | ".join(_choice(ch) for ch in c.choices))
    g = vm.graph
    lines.append(f"graph: {len(g.nodes)} nodes, {len(g.edges)} edges")
    for n in g.nodes:
        extra = []
        if n.sharded:
            extra.append("sharded " + ",".join(vm.classes[c].name for c in n.sharded))
        if n.conflicts:
            marks = [vm.conflicts[c] for c in n.conflicts]
            extra.append("conflict " + ",".join(
                f"{c.class_name}: {c.label if c.active else 'inactive'}" for c in marks))
        if n.collectives:
            extra.append("; ".join(n.collectives))
        label = n.label.replace("\n", " / ")
        lines.append(f"  [{n.kind}] {n.id}: {label}  compute {_ms(n.compute_s)} comm "
                     f"{_ms(n.comm_s)}" + (f"  ({'; '.join(extra)})" if extra else ""))
    for e in g.edges:
        badge = f"  [{e.badge}]" if e.badge else ""
        colours = ",".join(vm.classes[c].name for c in e.sharded) or "replicated"
        lines.append(f"  {e.source} -> {e.target}: {e.label} {colours}{badge}")
    s = vm.search
    state = "running" if s.running else "idle"
    best = f", best {_ms(s.best_step_time_s)}" if s.best_step_time_s is not None else ""
    lines.append(f"search: {state}, {s.simulations} simulations, {s.sims_per_s:,.0f}/s{best}")
    if vm.experts:
        lines.append("experts: " + ", ".join(
            f"{r.name} {_ms(r.step_time_s)} {_gib(r.peak_memory_bytes)}"
            f"{'' if r.feasible else ' (does not fit)'}"
            f"{' — ruled out by ' + ', '.join(r.ruled_out_by) if r.ruled_out_by else ''}"
            for r in vm.experts))
    if vm.pinned:
        lines.append("pinned: " + ", ".join(vm.pinned))
    if vm.details:
        d = vm.details
        lines.append(f"op {d.op}: {d.primitive} at {d.source} [{d.scope}]")
        for kind, ts in (("in", d.operands), ("out", d.results)):
            for t in ts:
                lines.append(f"  {kind} %{t.value} {t.dtype}{list(t.shape)} {list(t.classes)} "
                             f"{t.spec}")
    if vm.explained:
        lines += _explained(vm.explained)
    return "\n".join(lines)


def schedule_lines(sc) -> list[str]:
    """A pipeline's schedule as text: a row of cells per stage (F<m> / B<m>: the forward /
    backward of micro-batch m, F<m>.<r> in its run r of a circular schedule; "·": idle, the
    bubble), then the bubble and the hand-offs."""
    m_count = sc.micro_batches

    def cell(phase: str, w: int) -> str:
        if w < 0:
            return "·"
        return f"{phase}{w % m_count}" + (f".{w // m_count}" if sc.chunks > 1 else "")

    width = len(cell("B", sc.chunks * m_count - 1))
    runs = f", {sc.chunks} runs per stage" if sc.chunks > 1 else ""
    lines = [f"schedule ({sc.name}, {sc.schedule}{runs}): {m_count} micro-batches through "
             f"{sc.stages} stages over {sc.axis}, {sc.ticks} ticks per loop"]
    for s in range(sc.stages):
        fwd = " ".join(cell("F", w).ljust(width) for w in sc.forward[s])
        bwd = " ".join(cell("B", w).ljust(width) for w in sc.backward[s])
        lines.append(f"  stage {s} ({sc.stage_layers(s)}): {fwd} | {bwd}")
    lines.append(f"  bubble {sc.stages - 1}/{sc.ticks} = {sc.bubble:.0%} of each stage's ticks")
    if sc.handoff_bytes is not None:
        lines.append(f"  hand-off per tick: {_bytes(sc.handoff_bytes)}, "
                     f"{sc.handoff_s * 1e6:.1f} µs (collective-permute over {sc.axis}; "
                     f"{sc.handoffs} per step)")
    return lines


def _memory(m) -> str:
    """One line: the peak of the live bytes over the step, its op, and what it holds."""
    if not m.positions:
        return "memory over the step: no ops"
    parts = ", ".join(f"{k} {_bytes(v)}" for k, v in m.at_peak().items() if v)
    where = ", ".join(x for x in (m.peak_source, m.peak_scope) if x)
    return (f"memory over the step: peak {_bytes(m.peak_bytes)} at op {m.peak_op} "
            f"({m.peak_primitive}{'; ' + where if where else ''}), run {m.peak_position + 1} "
            f"of {m.steps} ({parts}); {len(m.positions)} positions drawn")


def _bytes(b) -> str:
    """Bytes in the largest binary unit that keeps a digit before the point (GiB, MiB...)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def _explained(x) -> list[str]:
    lines = [f"collectives of {x.subject}:" if x.collectives
             else f"collectives of {x.subject}: none"]
    for c in x.collectives:
        layers = f" in {c.layers} layers" if c.layers > 1 else ""
        lines.append(f"  {c.label} ×{c.count:g}{layers}: {c.bytes / 2**20:,.2f} MiB, "
                     f"{_ms(c.time_s)}; asked by {', '.join(c.classes) or '-'} at {c.primitive} "
                     f"(op {c.op}, {c.source or 'no source'})")
        lines.append(f"    why: {c.why}")
        if c.patterns:
            lines.append(f"    patterns: {', '.join(c.patterns)}")
        r = c.remedy
        lines.append(f"    removed by: {r.label} ({_ms(r.step_time_s)}, "
                     f"{_gib(r.peak_memory_bytes)})" if r else
                     "    removed by: no single choice tried removes it")
    return lines
