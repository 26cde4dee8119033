"""Stage 1, the program (DESIGN.md §1): `trace(fn, *args)` turns a JAX function and example
arguments into a flat `Program` — values (shape, dtype, producer, users) and ops (primitive,
params, operands, results, name scope, source line) in program order, with call-like
primitives inlined and `scan` / `while` / `cond` kept as regions. `replay` runs a Program again
op by op (export uses it to insert sharding constraints), `Replay` is that walk with the hooks
a rewrite of the step overrides; `state_inputs` says which arguments
are training state (what the step returns updated).
"""

from ._args import check_args
from ._program import (BODY_INPUT, CONST, INLINED_PRIMITIVES, INPUT, LITERAL, NO_OP,
                       REGION_PRIMITIVES, RESULT, Op, Program, Value, call_name,
                       source_line, user_line)
from ._replay import Replay, as_function, replay
from ._state import state_inputs, updated_inputs, updated_pairs
from ._trace import clean_scope, trace

__all__ = ["trace", "check_args", "Program", "Value", "Op", "replay", "Replay", "as_function",
           "state_inputs",
           "updated_inputs", "updated_pairs",
           "clean_scope", "source_line", "user_line", "call_name", "INLINED_PRIMITIVES",
           "REGION_PRIMITIVES", "INPUT",
           "CONST", "LITERAL", "RESULT", "BODY_INPUT", "NO_OP"]
