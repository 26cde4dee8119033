"""analyze(): sharding-equivalence classes and conflicts, on the zoo and on small programs."""

import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.extend import core as jex_core

import toast_lab as tl
from toast_lab.program import INLINED_PRIMITIVES
from toast_lab.rules import RULES

from . import ext_models

# q's and k's head_dim (contracted together) and v's (which passes on to wo) are two classes,
# named by the parameters they shard
EXPECTED_GPT = {"batch", "seq", "embed", "heads", "head_dim(wk,wq)", "head_dim(wo,wv)", "mlp",
                "vocab"}


@pytest.fixture(scope="module")
def gpt():
    fn, args = tl.zoo.get("gpt", layers=2)
    prog = tl.trace(fn, *args)
    return prog, tl.analyze(prog)


def _input(prog, path):
    return prog.inputs[prog.input_names.index(path)]


def _classes_of(an, prog, path):
    return an.dim_names(_input(prog, path))


def test_gpt_has_the_classes_a_practitioner_expects(gpt):
    prog, an = gpt
    names = {c.name for c in an.classes}
    assert EXPECTED_GPT <= names, names
    assert _classes_of(an, prog, "params/wte") == ("vocab", "embed")
    assert _classes_of(an, prog, "params/wpe") == ("seq", "embed")
    assert _classes_of(an, prog, "params/blocks/1/attn/wq") == ("embed", "heads", "head_dim(wk,wq)")
    # the names an older toast-lab gave them still find them (plan files saved then)
    assert an.class_named("head_dim_1").name == "head_dim(wo,wv)"
    assert an.class_named("head_dim").name == "head_dim(wk,wq)"
    assert _classes_of(an, prog, "params/blocks/0/mlp/w_in") == ("embed", "mlp")
    assert _classes_of(an, prog, "batch/tokens") == ("batch", "seq")
    assert not an.fallback_ops
    assert an.class_named("batch").size == 8
    summary = an.summary()
    for name in EXPECTED_GPT:
        assert name in summary


def test_gpt_attention_logits_conflict_between_query_and_key_positions(gpt):
    prog, an = gpt
    assert len(an.conflicts) == 1
    (c,) = an.conflicts
    assert c.class_name == "seq" and c.primitive == "dot_general"
    site = prog.values[c.site_value]
    assert an.dim_names(c.site_value) == ("batch", "heads", "seq", "seq")
    assert site.shape == (8, 4, 32, 32)
    assert "attn" in c.where and "_gpt.py" in c.source
    assert [s.label for s in c.sides] == ["dim2", "dim3"]
    assert c.resolutions == ("keep_dim2", "keep_dim3", tl.REPLICATE)
    assert c.layers == 2
    # The sides partition the conflicted dims: the query side never holds a key dim of the site.
    q, k = c.sides
    assert (c.site_value, 2) in q.members and (c.site_value, 3) in k.members
    assert not set(q.members) & set(k.members)
    # Softmax, the mask and their gradients are downstream of the conflict too.
    assert len(c.values) > 10


def test_tied_embedding_and_unembedding_share_classes(gpt):
    prog, an = gpt
    unembed = [op for op in prog.ops if op.primitive == "dot_general"
               and op.name_scope.startswith("unembed")]
    assert unembed
    wte = _input(prog, "params/wte")
    assert any(wte in op.operands for op in unembed)  # the forward x @ wte.T
    logits = next(op.results[0] for op in unembed if prog.values[op.results[0]].ndim == 3)
    assert an.dim_names(logits) == ("batch", "seq", "vocab")


def test_adam_moments_are_in_their_parameters_classes(gpt):
    prog, an = gpt
    params = [p for p in prog.input_names if p.startswith("params/")]
    assert params
    for p in params:
        leaf = p[len("params/"):]
        for moment in ("mu", "nu"):
            assert (_classes_of(an, prog, f"opt_state/0/{moment}/{leaf}")
                    == _classes_of(an, prog, p)), (moment, leaf)


def test_group_layers_gives_one_set_of_classes_however_many_layers():
    names = {}
    for layers in (1, 2, 4):
        fn, args = tl.zoo.get("gpt", layers=layers)
        an = tl.analyze(tl.trace(fn, *args), group_layers=True)
        names[layers] = sorted(c.name for c in an.classes)
        assert len(an.conflicts) == 1 and an.conflicts[0].layers == layers
        assert an.class_named("heads").layers == layers
    assert names[1] == names[2] == names[4]
    fn, args = tl.zoo.get("gpt", layers=4)
    ungrouped = tl.analyze(tl.trace(fn, *args), group_layers=False)
    assert len(ungrouped.classes) > len(names[4])
    assert len(ungrouped.conflicts) == 4


def test_gpt_scan_has_gpt_class_names_plus_the_stacked_layer_dim(gpt):
    _, an = gpt
    fn, args = tl.zoo.get("gpt_scan", layers=2)
    scan_an = tl.analyze(tl.trace(fn, *args))
    assert {c.name for c in scan_an.classes} == {c.name for c in an.classes} | {"layers"}
    assert [c.class_name for c in scan_an.conflicts] == ["seq"]
    assert scan_an.conflicts[0].primitive == "dot_general"


def test_analysis_is_deterministic():
    fn, args = tl.zoo.get("moe")
    a = tl.analyze(tl.trace(fn, *args))
    b = tl.analyze(tl.trace(fn, *args))
    assert [(c.id, c.name, c.members) for c in a.classes] == \
           [(c.id, c.name, c.members) for c in b.classes]
    assert [(c.name, c.sides) for c in a.conflicts] == [(c.name, c.sides) for c in b.conflicts]


@pytest.mark.parametrize("name", tl.zoo.names())
def test_every_primitive_in_the_zoo_has_a_rule(name):
    fn, args = tl.zoo.get(name)
    prog = tl.trace(fn, *args)
    missing = {p for p in prog.primitives() if p not in RULES and p not in INLINED_PRIMITIVES}
    assert not missing, f"{name}: no sharding rule for {sorted(missing)}"
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.ToastWarning)
        an = tl.analyze(prog, strict=True)
    assert not an.fallback_ops


@pytest.mark.parametrize("make", [ext_models.nnx_train_step, ext_models.equinox_train_step],
                         ids=["flax-nnx", "equinox"])
def test_flax_nnx_and_equinox_models_trace_without_fallbacks(make):
    fn, args = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.ToastWarning)
        an = tl.analyze(tl.trace(fn, *args))
    assert not an.fallback_ops
    assert len(an.classes) >= 3
    # The batch dim of the data reaches the loss: one class spans inputs and activations.
    biggest = max(an.classes, key=lambda c: c.num_values)
    assert biggest.num_values > 10


def _mystery_p():
    p = jex_core.Primitive("toast_test_mystery")
    p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    p.def_impl(lambda x: x)
    return p


MYSTERY = _mystery_p()


def test_unknown_primitive_warns_once_with_source_line_and_strict_raises():
    def f(x, w):
        y = MYSTERY.bind(x @ w)
        return MYSTERY.bind(y) @ w.T

    prog = tl.trace(f, jnp.ones((8, 4)), jnp.ones((4, 4)))
    with pytest.warns(tl.ToastWarning) as record:
        an = tl.analyze(prog)
    messages = [str(w.message) for w in record if "toast_test_mystery" in str(w.message)]
    assert len(messages) == 1
    assert "test_analysis.py" in messages[0] and "strict=True" in messages[0]
    assert len(an.fallback_ops) == 2
    rule = an.op_rules[an.fallback_ops[0]]
    assert rule.fallback and all(k is tl.rules.NEED_REPLICATION for k in rule.kinds)
    with pytest.raises(tl.UnknownPrimitiveError, match="toast_test_mystery"):
        tl.analyze(prog, strict=True)


def test_x_times_x_transpose_is_a_conflict():
    def f(x):
        return (x @ x.T).sum()

    an = tl.analyze(tl.trace(f, jnp.ones((16, 4))))
    assert len(an.conflicts) == 1
    c = an.conflicts[0]
    assert an.classes[c.class_id].size == 16
    assert c.resolutions == ("keep_dim0", "keep_dim1", tl.REPLICATE)


def test_reshape_split_carries_classes_through_compound_factors():
    def f(x, w):
        h = (x @ w).reshape(8, 16, 4, 8)       # [b, s, heads*head_dim] -> [b, s, heads, head_dim]
        return h.sum(axis=(2,)).reshape(8, 128).sum()

    prog = tl.trace(f, jnp.ones((8, 16, 32)), jnp.ones((32, 32)),
                    dim_names=(("batch", "seq", "embed"), ("embed", "fused")))
    an = tl.analyze(prog)
    split = next(op for op in prog.ops if op.primitive == "reshape")
    out = split.results[0]
    names = an.dim_names(out)
    assert names[:2] == ("batch", "seq")
    # heads is the major factor of the fused dim: a separate, size-4 class
    assert an.classes[an.value_classes[out][2]].size == 4
    assert an.classes[an.value_classes[out][3]].size == 8
    assert an.class_named("fused").size == 32


def test_class_named_suggests_close_names(gpt):
    _, an = gpt
    with pytest.raises(KeyError, match="head"):
        an.class_named("head")


def test_a_class_first_made_by_an_unscoped_op_is_named_by_the_function_that_made_it():
    # `concatenate[1]_2` said nothing of where it was; `mix/concatenate[1]` points at the
    # user's function (an op of the traced step itself keeps its plain name)
    def mix(x):
        return jnp.concatenate([x, x], axis=1)

    class Block:
        def __call__(self, x):
            return jnp.pad(x, ((0, 0), (1, 1)))

    def step(x):
        y = mix(x)
        return Block()(y).sum() + jnp.tile(x, (2, 1)).sum()

    an = tl.analyze(tl.trace(step, jnp.ones((4, 6))))
    names = {c.name for c in an.classes}
    assert "mix/concatenate[1]" in names, names
    assert "Block/pad[1]" in names, names  # a method is named by its class
    assert "tile[0]" in names, names  # made in the step itself: no `step/` prefix
    # plan files saved when these read `concatenate[1]` and `pad[1]` still load onto them
    assert an.class_named("concatenate[1]").name == "mix/concatenate[1]"
    assert an.class_named("pad[1]").name == "Block/pad[1]"
