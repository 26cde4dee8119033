"""Pipeline stages on third-party layer stacks (tests/third_party/stacked.py): flax.linen's
`nn.scan` (with and without `nn.remat`), flax.nnx's `nnx.vmap`-made layers under `nnx.scan`
(with and without `nnx.remat`), penzai's `LayerStack` and haliax's `Stacked`. Each gets the
fsdp+tp+pp expert plan (fsdp+tp on the mesh's other axes, its stack cut into stages over the
stage axis, micro-batches flowing through them), and one stack per library the circular
schedule too; `plan.jit` compiles it with the stages' hand-offs (collective-permutes over the
stage axis) and `tl.verify` checks it against the step as written on 8 simulated devices.
What a pipeline cannot run stays refused, saying why."""

from __future__ import annotations

import functools
import re

import pytest

import toast_lab as tl
from tests.third_party import traced
from tests.third_party.stacked import STACKED
from toast_lab.plan import MICRO_BATCHES_PER_STAGE

# haliax's own uses of APIs its dependencies deprecate
pytestmark = [pytest.mark.filterwarnings("ignore:`equinox.static_field` is deprecated"),
              pytest.mark.filterwarnings("ignore:jax.core.is_constant_dim is deprecated")]


@functools.cache
def built(name: str):
    return traced(STACKED, name)


def _stack(an) -> str:
    (group,) = [g.name for g in an.layer_groups if g.kind == "scanned"]
    return group


@pytest.mark.parametrize("name,stages", [
    ("linen-scan", 2), ("linen-scan-remat", 2), ("nnx-scan", 2), ("nnx-scan-remat", 2),
    ("nnx-scan-shared-norm", 2), ("penzai-stack", 2), ("haliax-stacked", 2),
    ("haliax-stacked-remat", 2), ("haliax-stacked-nested", 2), ("nnx-scan", 4),
    ("penzai-stack", 4),
])
def test_pipelined_expert_plan_matches_the_step_as_written(name, stages):
    fn, args, an = built(name)
    mesh = tl.Mesh({"stage": stages, "data": 8 // stages // 2, "model": 2}, device="cpu")
    plan = tl.strategies.expert(an, mesh)["fsdp+tp+pp"]
    assert plan.step.pipeline == tl.plan.Pipeline(_stack(an), "stage", stages)
    # as many micro-batches as divide the batch over "data", up to a few per stage
    assert plan.micro_batches == min(MICRO_BATCHES_PER_STAGE * stages,
                                     8 // mesh.axis_size("data"))
    _check(fn, args, plan, mesh, ticks=plan.micro_batches + stages - 1)


@pytest.mark.parametrize("name", ["linen-scan-remat", "nnx-scan-remat", "penzai-stack",
                                  "haliax-stacked-remat"])
def test_circular_schedule_on_third_party_stacks(name):
    """Two runs of layers per stage, each micro-batch going round the stages twice."""
    fn, args, an = built(name)
    mesh = tl.Mesh({"stage": 2, "data": 2, "model": 2}, device="cpu")
    plan = tl.strategies.expert(an, mesh)["fsdp+tp+pp"].with_pipeline(
        _stack(an), "stage", 2, "circular")
    assert str(plan.step.pipeline) == "stage:2x2"
    _check(fn, args, plan, mesh, ticks=2 * plan.micro_batches + 2 - 1)


def _check(fn, args, plan, mesh, ticks: int) -> None:
    """plan.jit's step matches the step as written, and each tick of each loop hands the
    micro-batches on: collective-permutes over the stage axis alone (the stage dim is the only
    sharded dim of what they move)."""
    report = tl.verify(fn, args, plan, mesh)
    assert report.numerics_ok, report
    permutes = {axes: total for (kind, axes), total in report.stats.collective_summary().items()
                if kind == "collective-permute"}
    assert ("stage",) in permutes, permutes
    assert permutes[("stage",)].count >= 2 * ticks


def test_dropout_in_the_stack_is_refused_naming_its_line():
    """Dropout draws its mask in the batch's shape: micro-batches would draw other masks, so
    no pipeline (which runs micro-batches) matches the step as written."""
    _, _, an = built("nnx-scan-dropout")
    line = _source_line("self.drop(self.down(")
    why = re.compile(rf"pipeline runs micro-batches through the stages.*stacked\.py:{line}:.*"
                     r"Dropout.*random numbers in the batch's shape", re.S)
    with pytest.raises(tl.PlanError, match=why):
        tl.Plan(an).with_pipeline(_stack(an), "stage", 2)
    experts = tl.strategies.expert(an, tl.Mesh({"stage": 2, "data": 2, "model": 2},
                                               device="cpu"))
    assert "fsdp+tp" in experts and "fsdp+tp+pp" not in experts
    assert why.search(experts.skipped["fsdp+tp+pp"])


def test_a_nested_remat_stack_is_cut_between_its_blocks():
    """haliax's "nested" checkpointing scans blocks of layers (an outer scan over 2 blocks of
    2): stages take whole blocks, so 4 stages do not divide it."""
    _, _, an = built("haliax-stacked-nested")
    (group,) = [g for g in an.layer_groups if g.kind == "scanned"]
    assert group.layers == 2
    with pytest.raises(tl.PlanError, match="4 stages do not divide its 2 layers"):
        tl.Plan(an).with_micro_batches(4).with_pipeline(group.name, "stage", 4)


def _source_line(text: str) -> int:
    import tests.third_party.stacked as module

    with open(module.__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)
