"""Stage 2, the rules (DESIGN.md §2): one table keyed by primitive name, filled by the modules
below. Takes an op's operand and result shapes and params; gives its OpRule — the factors, each
mapped to at most one dim of every operand and result, with a kind (pass-through, reduction,
need-replication) that says what sharding it costs. Unknown primitives get `conservative_rule`.
For the later stages: `UNARY` and `NARY` (the elementwise primitives' names, of one operand and
of several), `qkv_axes` and `is_causal` (a fused attention op's layout and causal mask, which
the cost model's flop counts read). `resized_params`: an op's params for smaller shapes (a
micro-batch), or a ResizeError saying why it cannot run on fewer examples.
"""

from ._core import (NEED_REPLICATION, PASS_THROUGH, REDUCTION, FactorKind, OpRule, RuleBuilder,
                    conservative_rule, factor_letter)
from ._table import RULES, has_rule, register, rule_for

# Importing a module registers its rules.
from . import (_attention, _control, _elementwise, _equinox, _identity,  # noqa: F401,E402
               _indexing, _linalg, _opaque, _random, _reduce, _shape)
from ._attention import is_causal, qkv_axes  # noqa: E402
from ._elementwise import NARY, UNARY  # noqa: E402
from ._opaque import permutes_shards  # noqa: E402
from ._resize import SHAPE_FREE, ResizeError, Shapes, resized_params  # noqa: E402

__all__ = [
    "FactorKind", "OpRule", "RuleBuilder", "PASS_THROUGH", "REDUCTION", "NEED_REPLICATION",
    "RULES", "register", "rule_for", "has_rule",
    "conservative_rule", "factor_letter", "UNARY", "NARY", "qkv_axes", "is_causal",
    "resized_params", "ResizeError", "Shapes", "SHAPE_FREE", "permutes_shards",
]
