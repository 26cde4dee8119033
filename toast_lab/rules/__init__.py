"""Per-primitive sharding rules (DESIGN.md §2): one table, filled by the modules below."""

from ._core import (NEED_REPLICATION, PASS_THROUGH, REDUCTION, FactorKind, OpRule, RuleBuilder,
                    conservative_rule, factor_letter)
from ._table import INLINED_PRIMITIVES, REGION_PRIMITIVES, RULES, has_rule, register, rule_for

# Importing a module registers its rules.
from . import _control, _elementwise, _indexing, _linalg, _misc, _reduce, _shape  # noqa: F401,E402

__all__ = [
    "FactorKind", "OpRule", "RuleBuilder", "PASS_THROUGH", "REDUCTION", "NEED_REPLICATION",
    "RULES", "INLINED_PRIMITIVES", "REGION_PRIMITIVES", "register", "rule_for", "has_rule",
    "conservative_rule", "factor_letter",
]
