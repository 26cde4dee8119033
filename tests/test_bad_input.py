"""Bad input gets a clear error that names the problem, where it is and the fix — never a
traceback from inside: plans against meshes, plan files, search arguments, verify's
arguments, and rules that cannot map an op."""

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jex_core
from jax.interpreters import mlir

import toast_lab as tl
from toast_lab.rules import RULES, register
from toast_lab.rules._helpers import expect, guarded

MESH = tl.Mesh({"data": 4, "model": 2}, device="h100")


def six_examples(w, x):
    return jnp.tanh(x @ w).sum()


@pytest.fixture(scope="module")
def an():
    return tl.analyze(tl.trace(six_examples, jax.ShapeDtypeStruct((16, 32), jnp.float32),
                               jax.ShapeDtypeStruct((6, 16), jnp.float32)))


def test_a_plan_is_checked_against_the_mesh_wherever_it_meets_one(an):
    batch = an.class_of(an.program.inputs[1], 0).name
    unknown = tl.Plan.replicated(an).with_axes(batch, "tensor")
    six_on_four = tl.Plan.replicated(an).with_axes(batch, "data")
    for use in (lambda p: tl.estimate(an, p, MESH), lambda p: p.shardings(MESH.jax_mesh()),
                lambda p: p.jit(six_examples, MESH.jax_mesh()),
                lambda p: tl.search(an, MESH, simulations=5, budget_s=None,
                                    warm_start={"mine": p})):
        with pytest.raises(tl.PlanError, match=r"sharded over \['tensor'\].*mesh axes"):
            use(unknown)
        with pytest.raises(tl.PlanError, match="size 6.*not divisible by the 4 devices"):
            use(six_on_four)


@pytest.mark.parametrize("kwargs, error, says", [
    ({"budget_s": "5"}, TypeError, "budget_s must be a number"),
    ({"budget_s": -1}, ValueError, "budget_s must be a positive"),
    ({"simulations": -3, "budget_s": None}, ValueError, "simulations must be positive"),
    ({"simulations": 2.5, "budget_s": None}, TypeError, "simulations must be an int"),
    ({"memory_cap": "16GB"}, TypeError, "memory_cap must be a number"),
    ({"warm_start": ["dp"]}, TypeError, "warm_start must map names to Plans"),
])
def test_search_arguments_are_checked_by_name(an, kwargs, error, says):
    with pytest.raises(error, match=says):
        tl.search(an, MESH, **kwargs)


def test_no_plan_fits_says_sizes_in_a_unit_that_shows_them(an):
    res = tl.search(an, MESH, simulations=20, budget_s=None, memory_cap=100)
    assert not res.feasible
    assert "100 B" in res.message and "0.00 GiB" not in res.message
    assert "KiB" in res.message or " B," in res.message


def test_verify_names_the_argument_that_differs(an):
    plan = tl.Plan.replicated(an)
    wrong = (np.zeros((16, 32), np.float32), np.zeros((8, 16), np.float32))
    with pytest.raises(ValueError, match=r"argument x is float32\[8, 16\].*traced with "
                                         r"float32\[6, 16\]"):
        tl.verify(six_examples, wrong, plan, MESH)
    with pytest.raises(ValueError, match="not shaped like"):
        tl.verify(six_examples, (np.zeros((16, 32), np.float32),), plan, MESH)


# --- a rule that fails on an op ----------------------------------------------------------------

_odd_p = jex_core.Primitive("toast_test_odd")
_odd_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
_odd_p.def_impl(lambda x: x)
mlir.register_lowering(_odd_p, mlir.lower_fun(lambda x: x, multiple_results=False))


@pytest.fixture
def failing_rule():
    @register("toast_test_odd")
    @guarded
    def odd_rule(ins, outs, params):
        expect(len(ins[0]) == 3, "it maps rank-3 operands only")

    yield
    del RULES["toast_test_odd"]


def odd_step(x):
    return _odd_p.bind(x) * 2.0  # the user's line the warning must name


def test_a_rule_that_cannot_map_an_op_warns_strict_raises_and_the_summary_says(failing_rule):
    prog = tl.trace(odd_step, jax.ShapeDtypeStruct((8, 16), jnp.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        an = tl.analyze(prog)
    messages = [str(w.message) for w in caught if issubclass(w.category, tl.ToastWarning)]
    assert len(messages) == 1
    assert "'toast_test_odd'" in messages[0] and "test_bad_input.py" in messages[0]
    assert "rank-3 operands only" in messages[0]
    assert an.fallback_ops
    assert "toast_test_odd x1 (rule failed: it maps rank-3 operands only)" in an.summary()
    with pytest.raises(tl.UnknownPrimitiveError, match="toast_test_odd.*strict=True"):
        tl.analyze(prog, strict=True)


def test_pure_callback_keeps_its_fallback_warning():
    def step(x):
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x).sum()

    with pytest.warns(tl.ToastWarning, match="no sharding rule for primitive 'pure_callback'"):
        tl.analyze(tl.trace(step, jax.ShapeDtypeStruct((8, 16), jnp.float32)))


# --- plan files --------------------------------------------------------------------------------

@pytest.fixture
def saved(an, tmp_path):
    batch = an.class_of(an.program.inputs[1], 1).name
    path = tl.Plan.replicated(an).with_axes(batch, "data").save(tmp_path / "plan.json",
                                                                 mesh=MESH)
    return path, json.loads(path.read_text()), batch


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def test_plan_file_axis_the_mesh_lacks(an, saved):
    path, doc, batch = saved
    doc["classes"][batch] = ["tensr"]
    with pytest.raises(tl.PlanFileError, match=r"plan.json: class .* sharded over 'tensr', "
                                               r"which mesh \(data=4, model=2\) does not have"):
        tl.Plan.load(_write(path, doc), an)


def test_plan_file_mesh_section_disagrees_with_the_mesh_given(an, saved):
    path, _, _ = saved
    with pytest.raises(tl.PlanFileError, match=r"saved for mesh \(data=4, model=2\) but is "
                                               r"loaded for mesh \(data=8\)"):
        tl.Plan.load(path, an, mesh=tl.Mesh({"data": 8}))
    assert tl.Plan.load(path, an, mesh=MESH).class_axes


@pytest.mark.parametrize("content, says", [
    (lambda doc: json.dumps(dict(doc, version=True)), '"version" must be a positive integer'),
    (lambda doc: b'{"format": "\xff"}', r"not UTF-8 text \(byte 0xff at offset 12\)"),
    (lambda doc: "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    (lambda doc: '{"version": ' + "9" * 5000 + "}", "a number in the file is too long"),
    (lambda doc: json.dumps(dict(doc, format="x" * 5000)), r"\"format\" is 'xxx.*\.\.\., "),
])
def test_corrupt_plan_files(an, saved, content, says):
    path, doc, _ = saved
    data = content(doc)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    with pytest.raises(tl.PlanFileError, match=says) as info:
        tl.Plan.load(path, an)
    assert len(str(info.value)) < 400  # what the file says is echoed shortened


def test_plan_file_with_a_very_long_class_name_is_echoed_shortened(an, saved):
    path, doc, _ = saved
    doc["classes"] = {"b" * 10_000: ["data"]}
    with pytest.raises(tl.PlanFileError, match=r"no class named 'b+\.\.\.'") as info:
        tl.Plan.load(_write(path, doc), an)
    assert len(str(info.value)) < 400
