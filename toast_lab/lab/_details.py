"""What the side panels say: the details of a selected op, and the copyable export snippet."""

from __future__ import annotations

from ._graph import type_label
from ._viewmodel import DetailsView, TensorView


def spec_text(spec) -> str:
    """PartitionSpec('data', None) -> "P('data', None)"; P() for a replicated value."""
    return "P(" + ", ".join(repr(e) if not isinstance(e, tuple) else repr(e) for e in spec) + ")"


def tensor_view(analysis, plan, value: int) -> TensorView:
    val = analysis.program.values[value]
    return TensorView(value=value, shape=tuple(int(s) for s in val.shape),
                      dtype=val.dtype.name, classes=analysis.dim_names(value),
                      spec=spec_text(plan.partition_spec(value)),
                      dim_axes=tuple(tuple(a) for a in plan.value_axes(value)))


def op_details(analysis, plan, op_id: int, compute_s: float, comm_s: float,
               collectives) -> DetailsView:
    """An op's primitive, shapes, the class of each dim, source line, PartitionSpecs under
    `plan`, its costs (seconds per step, all its runs) and the collectives it pays."""
    op = analysis.program.ops[op_id]
    return DetailsView(
        op=op_id, primitive=op.primitive, source=op.source, scope=op.name_scope,
        operands=tuple(tensor_view(analysis, plan, v) for v in op.operands),
        results=tuple(tensor_view(analysis, plan, v) for v in op.results),
        compute_s=float(compute_s), comm_s=float(comm_s),
        collectives=tuple(c.label for c in collectives))


def snippet(plan, mesh, path: str = "plan.json") -> str:
    """Python that applies `plan` with plain JAX: the mesh (None: the plan's axes, sizes left
    to fill in), `jax.jit` with in/out shardings, and the plan's logical-axis rules (class
    name -> mesh axes) for code that uses them, with complete rules for each domain where the
    plan overrides a class (ZeRO-1's embed@optimizer: the optimizer state's rules)."""
    an = plan.analysis
    if mesh is None:  # the plan's own axes, sizes to fill in
        used = [a for _, axes in plan.assignments for a in axes]
        used += [a for _, _, axes in plan.overrides for a in axes]
        axes = ", ".join(f"{a!r}: ..." for a in dict.fromkeys(used))
        mesh_line = (f"mesh = tl.Mesh({{{axes}}}, device=...).jax_mesh()   # the mesh this plan "
                     f"is for: its sizes must divide the classes")
    else:
        axes = ", ".join(f"{a!r}: {n}" for a, n in mesh.shape.items())
        mesh_line = f"mesh = tl.Mesh({{{axes}}}, device={mesh.device.name!r}).jax_mesh()"
    by_domain = plan.logical_axis_rules_by_domain()
    rules = []
    for name, mesh_axes in plan.logical_axis_rules():
        elsewhere = [f"{d}: {dict(r)[name]!r}" for d, r in by_domain.items()
                     if dict(r)[name] != mesh_axes]
        note = f"  # {', '.join(elsewhere)} (LOGICAL_AXIS_RULES_BY_DOMAIN)" if elsewhere else ""
        rules.append(f"    ({name!r}, {mesh_axes!r}),{note}")
    args = an.program.in_tree.children()[0].num_leaves if an.program.in_tree.children() else 0
    lines = [
        "import jax",
        "import toast_lab as tl",
        "",
        f"# {an.program.fn_name}: {plan!r}",
        mesh_line,
        f"plan = tl.Plan.load({path!r}, tl.analyze(tl.trace(fn, *args)))",
        f"in_shardings, out_shardings = plan.shardings(mesh)   # pytrees of NamedSharding "
        f"({args} argument leaves)",
        "step = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings)",
        "# or with the plan's sharding constraints at conflict sites and matmuls:",
        "# step = plan.jit(fn, mesh)",
        "",
        "# logical-axis rules (class name -> mesh axes), e.g. for flax's nn.logical_axis_rules",
        "LOGICAL_AXIS_RULES = [",
        *rules,
        "]",
        *_domain_rules(by_domain),
    ]
    return "\n".join(lines)


def _domain_rules(by_domain: dict) -> list[str]:
    """The snippet's per-domain rules, where the plan overrides classes in some domain."""
    if not by_domain:
        return []
    lines = ["",
             "# the plan shards some classes otherwise in one domain of the step: that domain's",
             "# arrays take its rules, e.g. nn.logical_to_mesh_sharding(opt_state_specs, mesh,",
             "# LOGICAL_AXIS_RULES_BY_DOMAIN['optimizer'])",
             "LOGICAL_AXIS_RULES_BY_DOMAIN = {"]
    for domain, rules in by_domain.items():
        lines.append(f"    {domain!r}: [")
        lines += [f"        ({name!r}, {mesh_axes!r})," for name, mesh_axes in rules]
        lines.append("    ],")
    return lines + ["}"]


__all__ = ["op_details", "snippet", "tensor_view", "spec_text", "type_label"]
