"""Rules for identities: sharding constraints, barriers, copies, device transfers.

Left to the conservative fallback on purpose: `pure_callback` (its results have no relation
to its operands that we can state). `custom_linear_solve` is not an op here: the tracer inlines
the `solve` jaxpr it runs (program/_trace.py); `platform_index` has a rule in _opaque.py.
"""

from __future__ import annotations

from ._core import RuleBuilder
from ._helpers import expect, guarded, tie_same_shape
from ._table import register


@register("sharding_constraint", "optimization_barrier", "device_put", "copy", "stop_gradient",
          "reshard", "layout_constraint", "name", "random_clone")
@guarded
def identity_rule(ins, outs, params):
    """Operand i is result i, dim for dim (sharding_constraint is a free pass-through here: what
    it forces is the plan's business, not the rule's)."""
    expect(len(ins) == len(outs))
    b = RuleBuilder(ins, outs)
    for i, (x, y) in enumerate(zip(ins, outs)):
        expect(x == y)
        tie_same_shape(b, x, operands=(i,), results=(i,))
    return b.build()
