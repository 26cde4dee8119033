"""Decisions beyond sharding as data: the layer groups a remat policy covers, whether a batch
splits into micro-batches (and the reason, with the user's line, where not), the
StepDecisions a Plan carries, plan files, tl.diff and the CLI. What plan.jit makes of them is
tests/test_step_rewrite.py."""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.ad_checkpoint import checkpoint_name

import toast_lab as tl
from tests.cli_support import usage_error
from toast_lab.cli import main
from toast_lab.plan import PlanFileError

MESH = tl.Mesh({"data": 2, "model": 4}, device="cpu")


@functools.cache
def analysed(name: str, **config):
    fn, args = tl.zoo.get(name, layers=2, **config)
    return tl.analyze(tl.trace(fn, *args))


def _line_of(fn, text: str) -> int:
    """The line number of the line of `fn`'s source that holds `text`."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


# --- layer groups ----------------------------------------------------------------------------


def test_layer_groups_are_the_scanned_stack_the_unrolled_layers_and_the_scopes():
    groups = {name: analysed(name).layer_groups for name in ("gpt", "gpt_scan", "llama")}
    kinds = {name: {g.name: (g.kind, g.layers) for g in gs} for name, gs in groups.items()}
    assert kinds["gpt"] == {"embed": ("scope", 1), "block*": ("layers", 2),
                            "unembed": ("scope", 1), "loss": ("scope", 1)}
    assert kinds["gpt_scan"]["block"] == ("scanned", 2)
    assert kinds["llama"]["layer"] == ("scanned", 2)
    (stack,) = [g for g in groups["gpt_scan"] if g.kind == "scanned"]
    prog = analysed("gpt_scan").program
    assert prog.ops[stack.units[0][0]].primitive == "scan"
    assert prog.ops[stack.backward_scans[0]].name_stack.startswith("transpose(")
    (layers,) = [g for g in groups["gpt"] if g.kind == "layers"]
    assert [prog_scope(analysed("gpt"), unit) for unit in layers.units] == ["block0", "block1"]
    assert not any(g.checkpointed for gs in groups.values() for g in gs)


def prog_scope(an, unit) -> str:
    (head,) = {an.program.ops[o].user_scope.split("/")[0] for o in unit}
    return head


def test_a_users_jax_checkpoint_marks_its_group():
    """The zoo's remat=True wraps each layer in jax.checkpoint: its recomputation sits in the
    backward pass, whose ops keep JAX's name stack through the inlined checkpoint."""
    for name, group in (("gpt", "block*"), ("gpt_scan", "block"), ("llama", "layer")):
        groups = {g.name: g for g in analysed(name, remat=True).layer_groups}
        assert groups[group].checkpointed, name
        assert not groups["unembed"].checkpointed


# --- micro-batching legality -----------------------------------------------------------------


def test_a_mean_over_the_batch_splits_into_micro_batches():
    """The zoo GPT's loss is a mean over the batch: its micro-batches' shares of the mean and
    of the gradients add up. The optimizer's update runs once, after the loop."""
    an = analysed("gpt")
    mb = an.micro_batching
    assert mb.legal and mb.batch == "batch" and mb.counts == (1, 2, 4, 8)
    prog = an.program
    assert sorted(prog.input_names[prog.inputs.index(v)] for v, _ in mb.split) == [
        "batch/labels", "batch/tokens"]
    assert all(prog.ops[o].user_scope.split("/")[0] != "optimizer" for o in mb.loop_ops)
    assert any(prog.ops[o].user_scope.startswith("optimizer") for o in mb.post_ops)
    # every gradient the optimizer reads is accumulated: one sum per parameter at least
    assert len(mb.accumulated) >= len(tl.zoo.get("gpt", layers=2)[1][0]["blocks"]) * 12


def test_the_moe_load_balancing_loss_is_refused_with_its_line():
    """Switch's auxiliary loss multiplies two means over the batch: its gradient reaches each
    token through the other tokens' routing, so micro-batches would compute another step."""
    from toast_lab.zoo import _moe

    mb = analysed("moe").micro_batching
    line = _line_of(_moe.route, "aux = E * jnp.sum")
    assert not mb.legal and mb.counts == (1,)
    assert f"_moe.py:{line}:" in mb.reason and "each example depends on the others" in mb.reason
    assert f"_moe.py:{line}:" in mb.source
    with pytest.raises(tl.PlanError, match="cannot be split.*_moe.py"):
        tl.Plan.replicated(analysed("moe")).with_micro_batches(2)


def _batchnorm_step():
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(16)(x)
            x = nn.BatchNorm(use_running_average=False)(x)  # statistics over the batch
            return nn.Dense(4)(nn.relu(x))

    net, opt = Net(), optax.adamw(1e-3)

    def step(params, stats, opt_state, batch):
        def loss_fn(p):
            out, new = net.apply({"params": p, "batch_stats": stats}, batch["x"],
                                 mutable=["batch_stats"])
            return jnp.mean((out - batch["y"]) ** 2), new["batch_stats"]

        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state, loss

    x, y = jnp.zeros((8, 12)), jnp.zeros((8, 4))
    variables = net.init(jax.random.key(0), x)
    args = (variables["params"], variables["batch_stats"], opt.init(variables["params"]),
            {"x": x, "y": y})
    return step, args, Net.__call__


def test_a_batchnorm_step_is_refused_micro_batching_with_the_users_line():
    pytest.importorskip("flax")
    step, args, call = _batchnorm_step()
    an = tl.analyze(tl.trace(step, *args))
    mb = an.micro_batching
    line = _line_of(call, "nn.BatchNorm(")
    assert not mb.legal
    assert mb.source.startswith(f"{__file__}:{line}:")
    assert f"test_step_decisions.py:{line}:" in mb.reason and "batch statistics" in mb.reason
    assert "normalization.py" in mb.reason  # and where in flax
    with pytest.raises(tl.PlanError, match=f"micro_batches=2.*cannot be split.*:{line}:"):
        tl.Plan.replicated(an).with_micro_batches(2)


def test_a_loss_normalised_by_a_count_over_the_batch_is_refused():
    """sum(loss * mask) / sum(mask): the count is a sum over the batch too, and the gradient
    of every example reads it; a plain mean divides by the traced batch size instead."""
    opt = optax.sgd(0.1)

    def step(w, opt_state, batch):
        def loss_fn(w):
            per_example = jnp.sum((batch["x"] @ w - batch["y"]) ** 2, axis=-1)
            return jnp.sum(per_example * batch["mask"]) / jnp.sum(batch["mask"])

        loss, g = jax.value_and_grad(loss_fn)(w)
        updates, opt_state = opt.update(g, opt_state, w)
        return optax.apply_updates(w, updates), opt_state, loss

    w = jnp.zeros((12, 4))
    batch = {"x": jnp.zeros((8, 12)), "y": jnp.zeros((8, 4)), "mask": jnp.ones((8,))}
    mb = tl.analyze(tl.trace(step, w, opt.init(w), batch)).micro_batching
    line = _line_of(step, "jnp.sum(per_example * batch")
    assert not mb.legal and f"test_step_decisions.py:{line}:" in mb.reason

    def plain(w, opt_state, batch):
        loss, g = jax.value_and_grad(
            lambda w: jnp.mean((batch["x"] @ w - batch["y"]) ** 2))(w)
        updates, opt_state = opt.update(g, opt_state, w)
        return optax.apply_updates(w, updates), opt_state, loss

    assert tl.analyze(tl.trace(plain, w, opt.init(w), batch)).micro_batching.legal


def test_activations_named_for_a_remat_policy_split_into_micro_batches():
    """`checkpoint_name` (haliax and MaxText name their layers' activations so a remat policy
    can pick them) names no size: it runs on a micro-batch as it is."""
    opt = optax.sgd(0.1)

    def step(w, opt_state, batch):
        def loss_fn(w):
            h = checkpoint_name(jnp.tanh(batch["x"] @ w), "hidden")
            return jnp.mean((h - batch["y"]) ** 2)

        loss, g = jax.value_and_grad(loss_fn)(w)
        updates, opt_state = opt.update(g, opt_state, w)
        return optax.apply_updates(w, updates), opt_state, loss

    w = jnp.zeros((12, 4))
    batch = {"x": jnp.zeros((8, 12)), "y": jnp.zeros((8, 4))}
    an = tl.analyze(tl.trace(step, w, opt.init(w), batch))
    assert an.micro_batching.legal, an.micro_batching.reason
    assert tl.Plan.replicated(an).with_micro_batches(4).micro_batches == 4


# --- the plan's record -----------------------------------------------------------------------


def test_a_plan_carries_its_step_decisions_and_defaults_to_the_step_as_written():
    an = analysed("gpt")
    plain = tl.Plan.replicated(an).with_axes("batch", "data")
    assert plain.step.is_default and plain.micro_batches == 1
    assert plain.remat_of("block*") == "everything"
    plan = plain.with_remat("block*", "full", pin=True).with_micro_batches(2)
    assert plan.remat_of("block*") == "full" and plan.micro_batches == 2
    assert plan.pinned == {"remat@block*"}
    assert repr(plan) == "Plan(batch=('data',), remat@block*=full, micro_batches=2)"
    assert plan != plain and plan == plain.with_micro_batches(2).with_remat("block*", "full")
    assert hash(plan) == hash(plain.with_micro_batches(2).with_remat("block*", "full"))
    assert plan.with_remat("block*", "everything").with_micro_batches(1) == plain
    assert plain.pin("micro_batches", "remat@unembed").pinned == {"micro_batches",
                                                                  "remat@unembed"}


@pytest.mark.parametrize("change, message", [
    (lambda p: p.with_remat("block", "full"), r"no layer group named 'block'.*'block\*'"),
    (lambda p: p.with_remat("block*", "minimal"), "'minimal' is not one of"),
    (lambda p: p.with_remat("block*", "offload_dots_with_no_batch_dims"),
     "memory kinds inside jit only on GPU and TPU"),
    (lambda p: p.with_micro_batches(3), "does not divide the 8 examples"),
    (lambda p: p.with_micro_batches(0), "positive integer"),
    (lambda p: p.pin("remat@blocks"), "no layer group named 'blocks'"),
    (lambda p: p.with_micro_batches(8).validate(MESH),
     "1 examples of class 'batch' per micro-batch, which its 2 devices"),
])
def test_bad_step_decisions_are_refused_naming_what_is_wrong(change, message):
    plan = tl.Plan.replicated(analysed("gpt")).with_axes("batch", "data")
    with pytest.raises(tl.PlanError, match=message):
        change(plan)


def test_a_scanned_stacks_own_checkpoint_cannot_be_overridden():
    plan = tl.Plan.replicated(analysed("gpt_scan", remat=True))
    with pytest.raises(tl.PlanError, match="wraps its layer in its own jax.checkpoint"):
        plan.with_remat("block", "everything", override=True)
    unrolled = tl.Plan.replicated(analysed("gpt", remat=True))
    assert unrolled.with_remat("block*", "everything", override=True).step.override == {
        "block*"}


# --- plan files, diff, CLI ------------------------------------------------------------------


def test_plan_files_carry_the_step_decisions_and_older_files_still_load(tmp_path):
    an = analysed("gpt")
    plan = (tl.Plan.replicated(an).with_axes("batch", "data")
            .with_remat("block*", "full", pin=True)
            .with_remat("unembed", "dots_with_no_batch_dims").with_micro_batches(4))
    doc = json.loads(plan.save(tmp_path / "p.json").read_text())
    assert doc["version"] == 3
    assert doc["step"] == {"remat": {"block*": "full", "unembed": "dots_with_no_batch_dims"},
                           "micro_batches": 4}
    back = tl.Plan.load(tmp_path / "p.json", an)
    assert back == plan and back.pinned == {"remat@block*"}
    plain = tl.Plan.replicated(an).with_axes("batch", "data")
    assert "step" not in json.loads(plain.save(tmp_path / "plain.json").read_text())
    old = Path(__file__).parent / "data" / "plan_v1_gpt_tiny.json"
    fn, args = tl.zoo.get("gpt", size="tiny", layers=2)
    assert tl.Plan.load(old, tl.analyze(tl.trace(fn, *args))).step.is_default


@pytest.mark.parametrize("step, message", [
    ({"remat": {"block*": "minimal"}}, r"\"remat\" gives group 'block\*' the policy 'minimal'"),
    ({"remat": ["block*"]}, "\"remat\" must map layer group names to policies"),
    ({"micro_batches": "4"}, "\"micro_batches\" must be a positive integer"),
    ({"micro_batches": 3}, "micro_batches=3 does not divide"),
    ({"remat": {"layers": "full"}}, "no layer group named 'layers'"),
    ({"overlap": True}, "field 'overlap' is unknown"),
    ("full", "\"step\" must be an object"),
])
def test_bad_step_sections_in_plan_files_name_the_field(tmp_path, step, message):
    an = analysed("gpt")
    doc = tl.Plan.replicated(an).to_dict(view={}) | {"step": step}
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(PlanFileError, match=message):
        tl.Plan.load(tmp_path / "bad.json", an)


def test_diff_shows_the_step_decisions_that_differ():
    an = analysed("gpt")
    a = tl.Plan.replicated(an).with_axes("batch", "data")
    b = a.with_remat("block*", "full").with_micro_batches(4)
    d = tl.diff(a, b)
    assert [(c.name, c.before, c.after) for c in d.steps] == [
        ("remat@block*", "everything", "full"), ("micro_batches", 1, 4)]
    assert not d.same and tl.diff(a, a).same
    assert "remat@block*: everything → full" in d.to_text()
    assert d.to_dict()["steps"][1] == {"name": "micro_batches", "before": 1, "after": 4}
    priced = tl.diff(a, b, mesh=MESH)
    assert "the estimates price the step as remat, micro-batches and stages rewrite it" in priced.note
    assert priced.peak_memory_bytes[1] < priced.peak_memory_bytes[0]  # priced, not ignored


def test_partition_applies_remat_pins_and_micro_batches_to_the_plan_it_writes(tmp_path,
                                                                              capsys):
    out = tmp_path / "plan.json"
    assert main(["partition", "gpt", "-c", "layers=2", "--mesh", "data=2,model=4", "--device",
                 "h100", "--budget", "0.5", "--pin", "batch=data", "--pin", "remat@block*=full",
                 "--micro-batches", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "remat@block*=full, micro_batches=2" in text
    doc = json.loads(out.read_text())
    assert doc["step"] == {"remat": {"block*": "full"}, "micro_batches": 2}
    assert {"remat@block*", "micro_batches", "batch"} <= set(doc["pinned"])
    assert "no layer group named 'blocks'" in usage_error(
        ["partition", "gpt", "-c", "layers=2", "--pin", "remat@blocks=full"], capsys)
    assert "cannot be split" in usage_error(
        ["partition", "moe", "-c", "layers=2", "--micro-batches", "2"], capsys)
