"""Pipeline stages on third-party layer stacks (tests/third_party/stacked.py): flax.linen's
`nn.scan` (with and without `nn.remat`), flax.nnx's `nnx.vmap`-made layers under `nnx.scan`
(with and without `nnx.remat`), penzai's `LayerStack` and haliax's `Stacked`. Each gets the
fsdp+tp expert plan on the mesh's other axes with its stack cut into stages; `plan.jit`
compiles it with the stages' hand-offs (collective-permutes over the stage axis) and
`tl.verify` checks it against the step as written on 8 simulated devices. What a pipeline
cannot run stays refused, saying why."""

from __future__ import annotations

import functools
import re
import warnings

import pytest

import toast_lab as tl
from tests.third_party.stacked import STACKED

MICRO_BATCHES = 4


@functools.cache
def built(name: str):
    builder, module = STACKED[name]
    pytest.importorskip(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # haliax's own, at import
        warnings.filterwarnings("ignore", "`equinox.static_field` is deprecated")
        fn, args = builder()
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.ToastWarning)  # every op has a rule that maps it
        an = tl.analyze(tl.trace(fn, *args))
    return fn, args, an


def _stack(an) -> str:
    (group,) = [g.name for g in an.layer_groups if g.kind == "scanned"]
    return group


def _pipelined(an, stages: int) -> tl.Plan:
    """The fsdp+tp expert plan on the mesh's other axes, the stack cut into `stages` over
    "stage", MICRO_BATCHES micro-batches flowing through them."""
    others = tl.Mesh({"data": 8 // stages // 2, "model": 2}, device="cpu")
    base = tl.strategies.expert(an, others)["fsdp+tp"]
    plan = tl.Plan.from_decisions(an, [(an.classes[k].name, axes)
                                       for k, axes in base.assignments])
    return plan.with_micro_batches(MICRO_BATCHES).with_pipeline(_stack(an), "stage", stages)


@pytest.mark.parametrize("name,stages", [
    ("linen-scan", 2), ("linen-scan-remat", 2), ("nnx-scan", 2), ("nnx-scan-remat", 2),
    ("nnx-scan-shared-norm", 2),
    ("penzai-stack", 2), ("haliax-stacked", 2), ("haliax-stacked-remat", 2),
    ("haliax-stacked-nested", 2), ("nnx-scan", 4), ("penzai-stack", 4),
])
def test_pipelined_third_party_step_matches_the_step_as_written(name, stages):
    fn, args, an = built(name)
    mesh = tl.Mesh({"stage": stages, "data": 8 // stages // 2, "model": 2}, device="cpu")
    plan = _pipelined(an, stages)
    report = tl.verify(fn, args, plan, mesh)
    assert report.numerics_ok, report
    # each tick of each loop hands the micro-batches on: collective-permutes over the stage
    # axis alone (the stage dim is the only sharded dim of what they move)
    permutes = {axes: total for (kind, axes), total in report.stats.collective_summary().items()
                if kind == "collective-permute"}
    assert ("stage",) in permutes, permutes
    assert permutes[("stage",)].count >= 2 * (MICRO_BATCHES + stages - 1)


def test_dropout_in_the_stack_is_refused_naming_its_line():
    """Dropout draws its mask in the batch's shape: micro-batches would draw other masks, so
    no pipeline (which runs micro-batches) matches the step as written."""
    _, _, an = built("nnx-scan-dropout")
    line = _source_line("self.drop(self.down(")
    with pytest.raises(tl.PlanError, match=re.compile(
            rf"pipeline runs micro-batches through the stages.*stacked\.py:{line}:.*"
            r"Dropout.*random numbers in the batch's shape", re.S)):
        tl.Plan(an).with_pipeline(_stack(an), "stage", 2)


def test_a_nested_remat_stack_is_cut_between_its_blocks():
    """haliax's "nested" checkpointing scans blocks of layers (an outer scan over 2 blocks of
    2): stages take whole blocks, so 4 stages do not divide it."""
    _, _, an = built("haliax-stacked-nested")
    (group,) = [g for g in an.layer_groups if g.kind == "scanned"]
    assert group.layers == 2
    with pytest.raises(tl.PlanError, match="4 stages do not divide its 2 layers"):
        tl.Plan(an).with_micro_batches(MICRO_BATCHES).with_pipeline(group.name, "stage", 4)


def _source_line(text: str) -> int:
    import tests.third_party.stacked as module

    with open(module.__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)
