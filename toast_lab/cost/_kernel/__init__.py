"""The cost model's kernel, compiled with numba: one phase per module.

    _masks       phase 1: where every value type lives under a plan
    _operands    phase 2: what each operand holds and what its op wants (with _axis_order)
    _reshard     phase 3: one price for every reshard, of op operands and shared reads alike
    _ops         phase 4: op costs (with _reductions, _scatter, _indexing, _halo)
    _reads       phase 5: shared reads, gathered once per sharding
    _schedule    phase 6: the overlap of collectives with compute
    _memory      phase 7: liveness, the peak, arguments and outputs
    _ledger      phase 8: where each charge is recorded, read back to ops
    _patterns    the XLA partitioner's cases, as a table of named patterns
    _charge      what one collective costs (alpha-beta), and how a charge is recorded
    _state       a model's tables and workspace (ModelState), allocated once
    _driver      the entries: step_and_peak, evaluate, charges, value_type_masks, fill_temps
    _ahead       the kernel compiled on a thread of its own from the first import
    _result      the totals, as a record with named fields

Masks are integers with one bit per mesh axis; the `mesh` table (MESH records) is indexed by
mask; `device` is one DEVICE record (cost/_tables.py).
"""

from . import _ahead
from ._charge import A2A, AG, AR, CP, NUM_KINDS, RS
from ._driver import (OVERLAP_NONE, OVERLAP_PERFECT, OVERLAP_SCHEDULED, charges,
                      edit_evaluator, empty_ledger, evaluate, fill_temps, live_bytes,
                      step_and_peak, value_type_masks)
from ._ledger import LEDGER, OP_ROW_OPERANDS, OP_ROWS, LedgerLayout, ledger_layout
from ._patterns import PATTERN_NAMES, PATTERNS, Pattern
from ._result import RESULT, as_result
from ._state import Liveness, ModelState, liveness, model_state

__all__ = ["AR", "AG", "RS", "A2A", "CP", "NUM_KINDS", "OVERLAP_SCHEDULED", "OVERLAP_NONE",
           "OVERLAP_PERFECT", "step_and_peak", "edit_evaluator", "evaluate", "charges",
           "empty_ledger",
           "value_type_masks", "fill_temps", "live_bytes", "LEDGER", "OP_ROWS", "OP_ROW_OPERANDS",
           "LedgerLayout", "ledger_layout", "PATTERNS", "PATTERN_NAMES", "Pattern", "RESULT",
           "as_result", "Liveness", "ModelState", "liveness", "model_state",
           "start_compile", "wait_for_compile", "compile_running", "compile_seconds",
           "compile_done"]

start_compile, wait_for_compile = _ahead.start, _ahead.wait
compile_running, compile_seconds, compile_done = _ahead.running, _ahead.elapsed_s, _ahead.done
