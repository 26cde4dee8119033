"""The kernel's phases, each imported and run on its own (toast_lab/cost/_kernel/).

The end-to-end tests (test_cost*.py, test_patterns.py, the fidelity benchmarks) check the
phases together against XLA; these pin what each one computes from its inputs, so that a
phase can be changed without reading the others: reshard pricing on one mesh, the schedule
against its two bounds, the memory sweep of a run of repeated blocks against the same blocks
laid out one after another, and the ledger against the totals. (The masks phase is checked
against Plan.value_axes in test_cost.py, operand classification and the op costs pattern by
pattern in test_patterns.py.)
"""

import numpy as np
import pytest
from numba import njit

import toast_lab as tl
from toast_lab.cost import CostModel
from toast_lab.cost import _kernel
from toast_lab.cost._kernel import _charge, _memory, _reshard, _schedule
from toast_lab.cost._kernel._patterns import GATHER
from toast_lab.cost._kernel._state import OP_STATE
from toast_lab.cost._tables import RUN
from toast_lab.plan import Plan

DATA, MODEL = 1, 2  # the axes' bits on {"data": 4, "model": 2}


@pytest.fixture(scope="module")
def gpt():
    fn, args = tl.zoo.get("gpt", size="tiny", layers=2)
    an = tl.analyze(tl.trace(fn, *args))
    model = CostModel(an, tl.Mesh({"data": 4, "model": 2}, device="h100"))
    return an, model


def _coll():
    return np.zeros((_charge.NUM_KINDS, 4, 3))


def test_reshard_gathers_a_shard_whole_over_its_axes(gpt):
    _, model = gpt
    mesh, coll = model.mesh_table, _coll()
    no_ledger = _kernel.empty_ledger(model.layout)[:0]
    shard = 1024.0  # P("data") of a 4 KiB value
    seconds, made = _reshard.gather_and_move(DATA, 0, 0, shard, 3.0, mesh, coll, no_ledger, 0,
                                             GATHER)
    assert made == 4 * shard
    assert seconds == pytest.approx(_charge.gather_time(4 * shard, DATA, mesh))
    assert coll[_charge.AG, DATA].tolist() == pytest.approx([3.0, 3 * 4 * shard, 3 * seconds])
    assert coll.sum() == pytest.approx(coll[_charge.AG, DATA].sum())  # nothing else charged


def test_reshard_hands_a_dim_to_other_axes_by_permute_then_gather(gpt):
    # P("data") to P("model") on data=4 x model=2: a permute of the 1/4 shard, then an
    # all-gather to the 1/2 shard over part of data (tests/test_cost.py checks it on XLA)
    _, model = gpt
    mesh, coll = model.mesh_table, _coll()
    no_ledger = _kernel.empty_ledger(model.layout)[:0]
    seconds, made = _reshard.gather_and_move(DATA, 0, MODEL, 1024.0, 1.0, mesh, coll,
                                             no_ledger, 0, GATHER)
    assert coll[_charge.CP, DATA | MODEL, 1] == 1024.0
    assert coll[_charge.AG, DATA, 1] == 2048.0
    assert made == 2048.0
    permute_s = coll[_charge.CP, DATA | MODEL, 2]
    assert seconds == pytest.approx(permute_s + _charge.gather_time(2048.0, DATA, mesh))
    # handed on, not gathered whole: its buffer is the new shard, not the whole value
    _, whole = _reshard.gather_and_move(DATA, 0, 0, 1024.0, 1.0, mesh, _coll(), no_ledger, 0,
                                        GATHER)
    assert made < whole == 4096.0


@njit
def _schedule_again(state):
    """The schedule phase alone, on what the phases before it left in the workspace."""
    ws = state.ws
    return _schedule.schedule(state.schedule, state.tables.ops, state.tables.shared_reads,
                              ws), ws.totals.copy()


def test_schedule_lies_between_perfect_overlap_and_none(gpt):
    an, model = gpt
    plans = [Plan.replicated(an), *tl.strategies.expert(an, model.mesh).values()]
    assert len(plans) >= 3
    for plan in plans:
        model.step_and_peak(*model.plan_arrays(plan))
        step, totals = _schedule_again(model.state)
        totals = _kernel.as_result(totals)
        assert step == pytest.approx(totals["scheduled_s"])
        compute, comm = totals["compute_s"], totals["communication_s"]
        assert max(compute, comm) <= step * (1 + 1e-9)
        assert step <= (compute + comm) * (1 + 1e-9)
        if comm == 0.0:
            assert step == pytest.approx(compute)


@njit
def _peak_live(delta, gdelta, op_state, op_type, runs):
    """peak_live, called from compiled code (the kernel's inner functions have no Python
    entry of their own)."""
    return _memory.peak_live(delta, gdelta, op_state, op_type, runs)


def _sweep(delta, gdelta, held, runs):
    """peak_live on plain arrays: held bytes per op type, one op type per position."""
    op_state = np.zeros(len(held), OP_STATE)
    op_state["gathered"] = held
    return _peak_live(delta, gdelta, op_state, np.arange(len(held)), runs)


def test_memory_sweep_of_a_run_equals_its_copies_laid_out():
    rng = np.random.default_rng(0)
    before, block, after, copies = 3, 5, 2, 4
    block_delta = rng.uniform(-1.0, 2.0, block)
    block_held = rng.uniform(0.0, 3.0, block)
    head, tail = rng.uniform(0.0, 2.0, before), rng.uniform(-2.0, 1.0, after)
    head_held, tail_held = rng.uniform(0.0, 1.0, before), rng.uniform(0.0, 1.0, after)
    # laid out: every copy of the block at its own positions, no runs
    delta = np.concatenate([head] + [block_delta] * copies + [tail])
    held = np.concatenate([head_held] + [block_held] * copies + [tail_held])
    expanded = _sweep(delta, np.zeros_like(delta), held, np.zeros(0, RUN))
    # compressed: the block once, a RUN record saying how many copies it stands for
    delta = np.concatenate([head, block_delta, tail])
    held = np.concatenate([head_held, block_held, tail_held])
    runs = np.array([(before, block, copies)], RUN)
    assert _sweep(delta, np.zeros_like(delta), held, runs) == pytest.approx(expanded)
    # and the peak is the largest live-plus-held at any position
    live = np.cumsum(np.concatenate([head] + [block_delta] * copies + [tail]))
    assert expanded == pytest.approx(max(0.0, (live + np.concatenate(
        [head_held] + [block_held] * copies + [tail_held])).max()))


def test_ledger_rows_add_up_to_the_collectives(gpt):
    an, model = gpt
    charged_plans = 0
    for name, plan in tl.strategies.expert(an, model.mesh).items():
        arrays = model.plan_arrays(plan)
        _, coll, _, _ = _kernel.evaluate(model.state, arrays,
                                         _kernel.liveness(model.ty.tables, model.memory), True)
        ledger, _ = _kernel.charges(model.state, arrays, _kernel.empty_ledger(model.layout))
        charged = ledger[ledger["count"] > 0]
        charged_plans += len(charged) > 0
        for kind in range(_charge.NUM_KINDS):
            rows = charged[charged["kind"] == kind]
            assert rows["count"].sum() == pytest.approx(coll[kind, :, 0].sum()), name
            assert (rows["count"] * rows["bytes"]).sum() == pytest.approx(
                coll[kind, :, 1].sum()), name
            assert (rows["count"] * rows["seconds"]).sum() == pytest.approx(
                coll[kind, :, 2].sum()), name
    assert charged_plans >= 2  # the experts do communicate
