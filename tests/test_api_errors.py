"""Mix-ups at the public API get a clear error naming the problem and the fix, never an
AttributeError or a NumPy error from inside: the wrong kind of mesh or analysis, a plan file's
hand-edited overrides, pinned names and device figures, dim_names that are not tuples of
names, and device figures no cost model can use. A plan file brings back the device it was
made for, even one that kept a preset's name."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toast_lab as tl

MESH = tl.Mesh({"data": 4, "model": 2}, device="h100")
H100 = tl.get_device("h100")


def attention_like(w, x):
    h = x @ w
    return (h @ h.T).sum()  # x[0] on both dims of the logits: a conflict


ARGS = (jax.ShapeDtypeStruct((16, 32), jnp.float32), jax.ShapeDtypeStruct((8, 16), jnp.float32))


@pytest.fixture(scope="module")
def prog():
    return tl.trace(attention_like, *ARGS)


@pytest.fixture(scope="module")
def an(prog):
    return tl.analyze(prog)


@pytest.fixture
def saved(an, tmp_path):
    """A plan file with a class, an override and a pin, for the 4 x 2 mesh."""
    plan = (tl.Plan.replicated(an).with_axes("x[0]", "data")
            .with_axes("w[1]", "model", domain="parameters").pin("x[0]"))
    path = plan.save(tmp_path / "plan.json", mesh=MESH)
    return path, json.loads(path.read_text())


def _write(tmp_path, doc, name="edited.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


# --- 1. the wrong kind of mesh or analysis --------------------------------------------------


@pytest.mark.parametrize("call", ["search", "expert", "exhaustive", "load", "replicated",
                                  "diff"])
def test_a_jax_mesh_or_a_dict_for_a_mesh_says_how_to_make_one(an, saved, call):
    path, _ = saved
    plan = tl.Plan.replicated(an)
    run = {
        "search": lambda m: tl.search(an, m, simulations=3, budget_s=None),
        "expert": lambda m: tl.strategies.expert(an, m),
        "exhaustive": lambda m: tl.exhaustive(an, m),
        "load": lambda m: tl.Plan.load(path, an, mesh=m),
        "replicated": lambda m: tl.Plan.replicated(an, m),
        "diff": lambda m: tl.diff(plan, plan, mesh=m),
    }[call]
    with pytest.raises(TypeError, match=r"expected a toast_lab Mesh.*got jax\.sharding\.Mesh "
                                        r"\(a jax mesh: tl\.Mesh\.from_jax"):
        run(MESH.jax_mesh())
    with pytest.raises(TypeError, match=r"expected a toast_lab Mesh.*got dict \(axis sizes: "
                                        r"tl\.Mesh\(\{'data': 8\}"):
        run({"data": 8})


def test_the_mesh_check_is_the_one_estimate_and_validate_make(an):
    """One helper: tl.estimate (through Plan.validate) says what tl.search says."""
    with pytest.raises(TypeError) as by_estimate:
        tl.estimate(an, tl.Plan.replicated(an), MESH.jax_mesh())
    with pytest.raises(TypeError) as by_search:
        tl.search(an, MESH.jax_mesh(), simulations=3, budget_s=None)
    assert str(by_search.value) == "tl.search: " + str(by_estimate.value)


@pytest.mark.parametrize("call", ["search", "expert", "replicated", "load", "from_decisions"])
def test_a_program_for_an_analysis_says_to_analyze_it(prog, saved, call):
    path, _ = saved
    run = {
        "search": lambda: tl.search(prog, MESH, simulations=3, budget_s=None),
        "expert": lambda: tl.strategies.expert(prog, MESH),
        "replicated": lambda: tl.Plan.replicated(prog),
        "load": lambda: tl.Plan.load(path, prog),
        "from_decisions": lambda: tl.Plan.from_decisions(prog, {"x[0]": "data"}),
    }[call]
    with pytest.raises(TypeError, match=r"expected an Analysis, got the Program of "
                                        r"'attention_like'.*tl\.analyze\(program\)"):
        run()


def test_anything_else_for_an_analysis_is_named(an):
    with pytest.raises(TypeError, match=r"tl\.search: expected an Analysis.*got Mesh"):
        tl.search(MESH, an, simulations=3, budget_s=None)


def test_diff_of_a_plan_and_not_a_plan(an):
    plan = tl.Plan.replicated(an)
    with pytest.raises(TypeError, match=r"tl\.diff compares two Plans.*b is a str: 'x'"):
        tl.diff(plan, "x")
    with pytest.raises(TypeError, match=r"a is a Mesh"):
        tl.diff(MESH, plan)


def test_with_axes_given_a_number_says_what_axes_are(an):
    with pytest.raises(TypeError, match=r"mesh axes are a mesh axis name, a tuple of names.*"
                                        r"got int 4"):
        tl.Plan.replicated(an).with_axes("x[0]", 4)


def test_a_link_given_as_a_tuple_says_to_write_a_link():
    with pytest.raises(TypeError, match=r"intra_node must be a toast_lab Link.*got tuple.*"
                                        r"write Link\(bandwidth=100000000000\.0, latency=1e-06\)"):
        tl.DeviceSpec("mine", {"bfloat16": 1e14, "float16": 1e14, "float32": 5e13}, 2**30,
                      1e12, (1e11, 1e-6), tl.Link(1e10, 1e-5), 8)
    with pytest.raises(TypeError, match="inter_node must be a toast_lab Link"):
        dataclasses.replace(H100, inter_node={"bandwidth": 1e10, "latency": 1e-5})


# --- 2. a plan file brings back the device it was made for ----------------------------------


def test_a_preset_changed_with_replace_round_trips_through_a_plan_file(an, tmp_path):
    mine = dataclasses.replace(H100, memory_bytes=40 * 2**30, memory_bandwidth=1e12)
    assert mine.name == H100.name  # what replace does, and what the old file trusted
    mesh = tl.Mesh({"data": 8}, device=mine)
    plan = tl.Plan.replicated(an).with_axes("x[0]", "data").with_mesh(mesh)
    back = tl.Plan.load(plan.save(tmp_path / "mine.json"), an)
    assert back.mesh == mesh and back.mesh.device == mine
    assert back.mesh.device.memory_bytes == 40 * 2**30
    assert back.mesh.device.memory_bandwidth == 1e12
    assert tl.estimate(an, back, back.mesh).step_time_s == tl.estimate(an, plan, mesh).step_time_s


def test_a_device_of_ones_own_and_per_axis_links_round_trip(an, tmp_path):
    mine = dataclasses.replace(H100, name="my-chip", devices_per_node=4, torus_dims=2,
                               torus_wrap=4, platform="tpu",
                               efficiency=tl.Efficiency(0.5, (8, 128, 128), 1, 0.9, 0.8))
    mesh = tl.Mesh({"data": 4, "model": 2}, device=mine,
                   links={"model": tl.Link(bandwidth=2e11, latency=3e-6)})
    back = tl.Plan.load(tl.Plan.replicated(an).save(tmp_path / "own.json", mesh=mesh), an)
    assert back.mesh == mesh and back.mesh.device == mine and dict(back.mesh.links) == {
        "model": tl.Link(2e11, 3e-6)}


def test_a_preset_is_written_by_name_and_loads_as_the_preset(an, tmp_path):
    path = tl.Plan.replicated(an).save(tmp_path / "h100.json", mesh=MESH)
    doc = json.loads(path.read_text())
    assert doc["mesh"] == {"axes": {"data": 4, "model": 2}, "device": "h100-80gb"}
    assert tl.Plan.load(path, an).mesh.device is H100


def test_the_file_numbers_win_over_the_preset_of_that_name(an, tmp_path):
    """A file whose figures differ from the preset of its name (a hand edit, or a preset
    revised since) loads with the file's figures."""
    path = tl.Plan.replicated(an).save(tmp_path / "h100.json", mesh=MESH)
    doc = json.loads(path.read_text())
    mine = dataclasses.replace(H100, memory_bytes=40 * 2**30)
    doc["mesh"]["device_spec"] = tl.Plan.replicated(an).to_dict(
        tl.Mesh({"data": 4, "model": 2}, device=mine))["mesh"]["device_spec"]
    loaded = tl.Plan.load(_write(tmp_path, doc), an)
    assert loaded.mesh.device.memory_bytes == 40 * 2**30 and loaded.mesh.device.name == "h100-80gb"


@pytest.mark.parametrize("edit, says", [
    (lambda s: s.pop("memory_bytes"), r"missing 'memory_bytes'"),
    (lambda s: s.update(memry_bytes=1), r"unknown 'memry_bytes'"),
    (lambda s: s.update(memory_bytes=-1), r"memory_bytes must be positive"),
    (lambda s: s["intra_node"].update(bandwidth="fast"), r"Link bandwidth must be a number"),
    (lambda s: s["efficiency"].update(tile=[1, 2]), r"Efficiency needs tile"),
    (lambda s: s.update(devices_per_node=8.5), r"devices_per_node must be an integer"),
    (lambda s: s.update(platform="gpus"), r"platform must be one of"),
])
def test_a_hand_edited_device_spec_fails_clearly(an, tmp_path, edit, says):
    mesh = tl.Mesh({"data": 8}, device=dataclasses.replace(H100, memory_bytes=40 * 2**30))
    doc = tl.Plan.replicated(an).to_dict(mesh)
    edit(doc["mesh"]["device_spec"])
    path = _write(tmp_path, doc)
    with pytest.raises(tl.PlanFileError, match=r"edited\.json: the mesh section's "
                                              r"\"device_spec\" does not describe a device: .*"
                                              + says):
        tl.Plan.load(path, an)


def test_a_hand_edited_link_fails_clearly(an, tmp_path):
    doc = tl.Plan.replicated(an).to_dict(
        tl.Mesh({"data": 8}, device="h100", links={"data": tl.Link(1e9, 1e-6)}))
    doc["mesh"]["links"] = {"dta": {"bandwidth": 1e9, "latency": 1e-6}}
    with pytest.raises(tl.PlanFileError, match=r"\"links\": links names axis 'dta'"):
        tl.Plan.load(_write(tmp_path, doc), an)


# --- 3. overrides are checked like classes --------------------------------------------------


@pytest.mark.parametrize("edit, says", [
    (lambda o: o["w[1]"].update(parameters=["modle"]),
     r"override 'w\[1\]@parameters' is sharded over 'modle', which mesh \(data=4, model=2\) "
     r"does not have.*\"overrides\" section"),
    (lambda o: o.update({"w[7]": o.pop("w[1]")}),
     r"in the file's \"overrides\" section: no class named 'w\[7\]'"),
    (lambda o: o["w[1]"].update(optimiser=o["w[1]"].pop("parameters")),
     r"override of class 'w\[1\]' names domain 'optimiser'"),
])
@pytest.mark.parametrize("with_mesh", [False, True])
def test_a_typo_in_overrides_fails_at_load(an, saved, tmp_path, edit, says, with_mesh):
    _, doc = saved
    edit(doc["overrides"])
    path = _write(tmp_path, doc)
    with pytest.raises(tl.PlanFileError, match=r"edited\.json: " + says):
        tl.Plan.load(path, an, mesh=MESH if with_mesh else None)


def test_an_override_axis_is_checked_against_the_file_mesh_without_a_mesh_section(an, saved,
                                                                                   tmp_path):
    _, doc = saved
    doc["overrides"]["w[1]"]["parameters"] = ["dta"]
    doc["mesh"] = None
    plan = tl.Plan.load(_write(tmp_path, doc), an)  # no mesh to check against: loads ...
    with pytest.raises(tl.PlanError, match="dta"):  # ... and fails where it meets one
        plan.validate(MESH)


# --- 4. pins name what exists -----------------------------------------------------------------


def test_pin_of_an_unknown_name_lists_classes_and_conflicts(an):
    (conflict,) = [c.name for c in an.conflicts]
    with pytest.raises(tl.PlanError) as err:
        tl.Plan.replicated(an).pin("x0")
    text = str(err.value)
    assert text.startswith("no class, conflict or override named 'x0'.")
    # x[0], the argument's path, is the batch's former name: the hint names the class
    assert "Did you mean ['batch']" in text
    assert "Classes: ['features', 'w[1]', 'batch']" in text
    assert f"conflicts: [{conflict!r}]" in text
    assert '"<class>@<domain>"' in text


def test_pin_lists_shortened_when_long():
    def chain(ws, x):
        for w in ws:
            x = x @ w
        return x.sum()

    ws = [jax.ShapeDtypeStruct((3 + i, 4 + i), jnp.float32) for i in range(24)]
    an = tl.analyze(tl.trace(chain, ws, jax.ShapeDtypeStruct((2, 3), jnp.float32)))
    assert len(an.classes) > 20
    with pytest.raises(tl.PlanError, match=r"Classes: \[.*'mlp\(ws/18\)', \.\.\. \(\d+ more\)\]"):
        tl.Plan.replicated(an).pin("nope")


def test_a_bad_pinned_name_in_a_plan_file_says_where(an, saved, tmp_path):
    _, doc = saved
    doc["pinned"] = ["x0"]
    with pytest.raises(tl.PlanFileError, match=r"edited\.json: in the file's \"pinned\" list: "
                                              r"no class, conflict or override named 'x0'\. "
                                              r"Did you mean \['batch'\]\? Classes: "):
        tl.Plan.load(_write(tmp_path, doc), an)


# --- 5. dim_names ------------------------------------------------------------------------------


def _loss(p, x):
    return jnp.sum(x @ p["w"])


P = {"w": jax.ShapeDtypeStruct((4, 8), jnp.float32)}
X = jax.ShapeDtypeStruct((8, 4), jnp.float32)


def test_dim_names_of_a_str_is_refused_with_the_tuple_to_write():
    with pytest.raises(TypeError, match=r"dim_names\[0\] gives the array of shape \(4, 8\) the "
                                        r"str 'em', not a tuple of names.*\('e', 'm'\)"):
        tl.trace(_loss, P, X, dim_names=({"w": "em"}, ("batch", "e")))
    with pytest.raises(TypeError, match=r"the str 'embed'.*\('embed', \.\.\.\) with 2 names"):
        tl.trace(_loss, P, X, dim_names=({"w": "embed"}, None))
    with pytest.raises(TypeError, match=r"dim_names\[1\].*\('batch', 'embed'\)"):
        tl.trace(_loss, P, X, dim_names=(None, "batch embed"))
    with pytest.raises(TypeError, match=r"tuple of names \(str, or None"):
        tl.trace(_loss, P, X, dim_names=({"w": ("embed", 3)}, None))
    names = tl.trace(_loss, P, X, dim_names=({"w": ("e", "m")}, ["batch", "e"])).dim_names
    assert ("e", "m") in names and ("batch", "e") in names


@pytest.mark.parametrize("dim_names", [{"w": ("a", "b")}, {"p": None, "x": None}])
def test_dim_names_as_a_dict_says_one_entry_per_argument(dim_names):
    with pytest.raises(TypeError, match=r"dim_names is a tuple with one entry per positional "
                                        r"argument.*got a dict.*dim_names=\(\{\.\.\.\}, None,\)"):
        tl.trace(_loss, P, X, dim_names=dim_names)


# --- 6. nits -------------------------------------------------------------------------------------


def test_an_empty_axis_name_is_refused(an):
    for axes in ("", ("data", "")):
        with pytest.raises(tl.PlanError, match="empty name"):
            tl.Plan.replicated(an).with_axes("x[0]", axes)


@pytest.mark.parametrize("change, says", [
    ({"peak_flops": {**H100.peak_flops, "bfloat16": float("inf")}},
     r"peak_flops\['bfloat16'\] must be positive and finite"),
    ({"memory_bytes": float("inf")}, "memory_bytes must be positive and finite"),
    ({"memory_bandwidth": float("nan")}, "memory_bandwidth must be positive and finite"),
    ({"intra_node": None}, "intra_node must be a toast_lab Link"),
    ({"torus_dims": -1}, "torus_dims must be an integer >= 0"),
    ({"torus_wrap": 2.5}, "torus_wrap must be an integer >= 0"),
    ({"peak_flops": 1e15}, "peak_flops must map dtype names to FLOP/s"),
    ({"peak_flops": {**H100.peak_flops, "float32": "67e12"}}, r"must be a number \(FLOP/s\)"),
])
def test_device_figures_no_estimate_can_use_are_refused(change, says):
    with pytest.raises((TypeError, ValueError), match=says):
        dataclasses.replace(H100, **change)


def test_link_latency_must_be_finite():
    with pytest.raises(ValueError, match="Link latency must be >= 0 and finite"):
        tl.Link(1e9, float("inf"))


def test_numpy_integers_are_counts_like_mesh_sizes():
    spec = dataclasses.replace(H100, devices_per_node=np.int64(4), torus_dims=np.int32(0))
    assert spec.devices_per_node == 4 and type(spec.devices_per_node) is int
    assert type(spec.torus_dims) is int
    mesh = tl.Mesh({"data": np.int64(8)}, device=spec)
    assert mesh.link("data") == spec.inter_node  # 8 devices over 4 per node cross nodes


def test_estimate_and_the_lab_session_name_misplaced_arguments():
    an = tl.analyze(tl.trace(lambda x: x * 2, jnp.ones((8, 4))))
    mesh, plan = tl.Mesh({"data": 8}), tl.Plan.replicated(an)
    with pytest.raises(TypeError, match=r"takes \(analysis, plan, mesh\), in that order"):
        tl.estimate(an, mesh, plan)
    with pytest.raises(TypeError, match=r"call tl.analyze\(program\)"):
        tl.estimate(an.program, plan, mesh)
    with pytest.raises(TypeError, match=r"tl.lab.Session: expected a toast_lab Mesh"):
        tl.lab.Session(an, {"data": 8})
