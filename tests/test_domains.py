"""Domains of a training step (compute, parameters, optimizer state): found from the dataflow
on the zoo and on flax/equinox steps."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toast_lab as tl
from toast_lab.analysis import COMPUTE, OPTIMIZER, PARAMETERS, domains

from . import ext_models


@functools.cache
def analysed(name, **config):
    fn, args = tl.zoo.get(name, **config)
    return fn, args, tl.analyze(tl.trace(fn, *args))


@functools.cache
def external(which):
    fn, args = getattr(ext_models, f"{which}_train_step")()
    return fn, args, tl.analyze(tl.trace(fn, *args))


def _inputs_by_domain(an):
    d = domains(an)
    out = {COMPUTE: set(), PARAMETERS: set(), OPTIMIZER: set()}
    for v, path in zip(an.program.inputs, an.program.input_names):
        out[d.of(v)].add(path.split("/")[0])
    return out


@pytest.mark.parametrize("name", ["mlp", "gpt", "gpt_scan", "moe", "cnn", "gnn"])
def test_zoo_arguments_fall_into_parameters_optimizer_state_and_data(name):
    _, _, an = analysed(name)
    assert _inputs_by_domain(an) == {PARAMETERS: {"params"}, OPTIMIZER: {"opt_state"},
                                     COMPUTE: {"batch"}}


@pytest.mark.parametrize("which", ["nnx", "equinox"])
def test_flax_and_equinox_steps_get_the_same_domains(which):
    _, _, an = external(which)
    assert _inputs_by_domain(an) == {PARAMETERS: {"params"}, OPTIMIZER: {"opt_state"},
                                     COMPUTE: {"batch"}}


def _check_step_structure(an):
    """Updated parameters are parameters, updated moments optimizer state; every value with
    the batch is compute; every contraction whose result has only parameter classes and whose
    operands carry the batch (a weight gradient) is in the optimizer domain."""
    d = domains(an)
    prog = an.program
    for out, inp in d.updated.items():
        assert d.of(out) == d.of(inp), prog.values[out]
    batchy = d.activation_classes
    assert batchy
    state_classes = {c for v in d.parameters for c in an.value_classes[v] if c >= 0}
    gradients = 0
    for op in prog.ops:
        for r in op.results:
            if any(c in batchy for c in an.value_classes[r]):
                assert d.of(r) == COMPUTE, (op, op.source)
        if op.primitive != "dot_general":
            continue
        r = op.results[0]
        feeds_on_batch = any(c in batchy for u in op.operands for c in an.value_classes[u])
        classes = {c for c in an.value_classes[r] if c >= 0}
        if feeds_on_batch and classes and classes <= state_classes and d.of(r) == OPTIMIZER:
            gradients += 1
    return gradients


@pytest.mark.parametrize("name", ["mlp", "gpt", "gpt_scan", "moe", "cnn", "gnn"])
def test_weight_gradients_are_optimizer_domain_and_activations_compute(name):
    _, _, an = analysed(name)
    assert _check_step_structure(an) > 0


@pytest.mark.parametrize("which", ["nnx", "equinox"])
def test_weight_gradients_of_flax_and_equinox_steps(which):
    _, _, an = external(which)
    assert _check_step_structure(an) > 0


def test_domains_do_not_depend_on_names():
    fn, args = tl.zoo.get("gpt")
    named = tl.analyze(tl.trace(fn, *args))
    anon = tl.analyze(tl.trace(fn, *args, dim_names=(None, None, None)))
    assert np.array_equal(domains(named).of_value, domains(anon).of_value)


def test_a_weight_cast_for_the_forward_is_a_parameter_and_the_loss_is_compute():
    def loss(params, x):
        w = params["w"].astype(jnp.bfloat16)  # mixed precision: the cast weight is a weight
        return jnp.mean(jnp.square(x.astype(jnp.bfloat16) @ w))

    def step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    params = {"w": jax.ShapeDtypeStruct((16, 32), jnp.float32)}
    an = tl.analyze(tl.trace(step, params, jax.ShapeDtypeStruct((8, 16), jnp.float32)))
    d = domains(an)
    prog = an.program
    casts = [op for op in prog.ops if op.primitive == "convert_element_type"
             and op.operands[0] == prog.inputs[0]]
    assert casts and all(d.of(op.results[0]) == PARAMETERS for op in casts)
    assert d.of(prog.outputs[0]) == PARAMETERS  # the updated weight
    assert d.of(prog.outputs[1]) == COMPUTE  # the loss
    assert not d.optimizer_state  # plain SGD: no optimizer state


def test_scan_bodies_share_their_operands_domains():
    _, _, an = analysed("gpt_scan")
    d = domains(an)
    prog = an.program
    for op in prog.ops:
        if op.primitive != "scan":
            continue
        for a, b in tl.analysis._domains.region_links(op):
            if a in op.operands and prog.values[b].origin == "body":
                assert d.of(a) == d.of(b)
            if b in op.results:
                assert d.of(a) == d.of(b)
    stacked = [v for v, p in zip(prog.inputs, prog.input_names) if p.startswith("params/blocks")]
    assert stacked and all(d.of(v) == PARAMETERS for v in stacked)


def test_a_program_without_a_batch_has_only_the_trivial_split():
    def step(w, x):  # one example: every dim of the data is a dim of the weight
        return w - 0.1 * jax.grad(lambda w: jnp.sum((w @ x) ** 2))(w), jnp.sum(w)

    an = tl.analyze(tl.trace(step, jax.ShapeDtypeStruct((4, 4), jnp.float32),
                             jax.ShapeDtypeStruct((4,), jnp.float32)))
    d = domains(an)
    assert not d.activation_classes and not d.optimizer_state
    assert {d.of(v) for v in range(len(an.program.values))} <= {COMPUTE, PARAMETERS}
