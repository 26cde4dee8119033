"""Nothing lost: every file toast-lab writes is written atomically and never over a file of the
user's without being asked; plan files are read strictly (regular files only, bounded, no
duplicate keys, a mesh section that holds or an error naming it); pins read axis names before
keywords and class names before domain overrides; the Lab's history stays bounded."""

import errno
import json
import os
import stat
import threading
import warnings

import jax
import jax.numpy as jnp
import pytest

import toast_lab as tl
from tests.cli_support import usage_error
from toast_lab.cli import _parse_pins, main
from toast_lab.lab import PinError, Session
from toast_lab.lab._details import snippet
from toast_lab.lab._session import HISTORY_LIMIT
from toast_lab.plan import ExistingFileError, _planfile

MESH = tl.Mesh({"data": 4, "model": 2}, device="h100")


def contrastive(w, x):  # x @ x.T: the batch class on both dims of one value, a conflict
    e = jnp.tanh(x @ w)
    return (e @ e.T).sum()


@pytest.fixture(scope="module")
def an():
    return tl.analyze(tl.trace(contrastive, jax.ShapeDtypeStruct((16, 32), jnp.float32),
                               jax.ShapeDtypeStruct((8, 16), jnp.float32),
                               dim_names=(("features", "embed"), ("batch", "features"))))


@pytest.fixture
def plan(an):
    return tl.Plan.replicated(an).with_axes("batch", "data")


@pytest.fixture
def saved(plan, tmp_path):
    """A plan file, and its bytes: what must survive every failed write below."""
    path = plan.save(tmp_path / "plan.json", mesh=MESH)
    return path, path.read_bytes()


def _left_in(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# --- writes are atomic ----------------------------------------------------------------------


def test_a_rename_that_fails_leaves_the_previous_plan_file_whole(an, plan, saved,
                                                                 monkeypatch):
    path, before = saved

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space left"):
        plan.with_axes("embed", "model").save(path, mesh=MESH)
    assert path.read_bytes() == before
    assert _left_in(path.parent) == ["plan.json"]  # no temporary file left behind
    assert tl.Plan.load(path, an) == plan


def test_a_disk_that_fills_midway_leaves_the_previous_plan_file_whole(plan, saved,
                                                                      monkeypatch):
    path, before = saved
    real_write = os.write

    def half_then_full(fd, data):  # writes some bytes, then the disk is full
        if len(data) > 64:
            real_write(fd, bytes(data[:64]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        plan.with_axes("embed", "model").save(path, mesh=MESH)
    monkeypatch.undo()
    assert path.read_bytes() == before and _left_in(path.parent) == ["plan.json"]


def test_a_document_that_cannot_be_serialized_leaves_the_previous_plan_file_whole(
        an, plan, saved):
    path, before = saved
    session = Session(an, MESH)
    with pytest.raises(ValueError, match="not JSON compliant"):
        session.export(path, extra={"estimate": {"step_time_s": float("nan")}})
    assert path.read_bytes() == before and _left_in(path.parent) == ["plan.json"]


def test_a_session_export_that_fails_midway_leaves_the_previous_export(an, saved,
                                                                        monkeypatch):
    path, before = saved
    session = Session(an, MESH)
    session.pin("embed", "model")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(
        OSError(errno.EIO, "Input/output error")))
    with pytest.raises(OSError, match="Input/output error"):
        session.export(path)
    monkeypatch.undo()
    assert path.read_bytes() == before and _left_in(path.parent) == ["plan.json"]
    assert tl.Plan.load(session.export(path), an) == session.plan  # and then it works


def test_a_replaced_file_keeps_its_permissions_and_a_link_is_written_through(an, plan,
                                                                             saved):
    path, _ = saved
    os.chmod(path, 0o600)
    plan.with_axes("embed", "model").save(path, mesh=MESH)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    link = path.with_name("latest.json")
    link.symlink_to(path.name)
    plan.save(link, mesh=MESH)
    assert link.is_symlink() and tl.Plan.load(path, an) == plan


def test_partition_out_that_fails_to_write_keeps_the_previous_plan(saved, monkeypatch,
                                                                   capsys):
    path, before = saved

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(SystemExit) as exit_info:
        main(["partition", "mlp", "--mesh", "data=8", "--budget", "0.2", "--out", str(path)])
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]  # after the search's progress bar
    assert "cannot write the plan: No space left on device" in line, line
    assert path.read_bytes() == before and _left_in(path.parent) == ["plan.json"]


def test_the_lab_notebook_is_written_whole_or_not_at_all(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "replace", lambda src, dst: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    line = usage_error(["lab", "mlp", "--no-launch"], capsys)
    assert "cannot write it: No space left on device" in line, line
    assert _left_in(tmp_path) == []


# --- never over a user's file ---------------------------------------------------------------


def test_save_and_export_refuse_a_file_that_is_not_a_plan_file(an, plan, tmp_path):
    train = tmp_path / "train.py"
    train.write_text("import jax\n")
    for write in (lambda **kw: plan.save(train, mesh=MESH, **kw),
                  lambda **kw: Session(an, MESH).export(train, **kw)):
        with pytest.raises(ExistingFileError, match=r"train\.py exists and is not a toast-lab "
                                                    r"plan file: not overwritten; pass "
                                                    r"overwrite=True to replace it"):
            write()
        assert train.read_text() == "import jax\n"
    assert isinstance(ExistingFileError("x"), FileExistsError)
    plan.save(train, mesh=MESH, overwrite=True)  # asked for: replaced
    assert tl.Plan.load(train, an) == plan


def test_an_earlier_plan_file_or_an_empty_file_is_replaced(an, plan, saved, tmp_path):
    """A person re-exports as they go: their own plan file (for this or any program) is
    replaced without being asked, and so is an empty file (nothing to lose)."""
    path, _ = saved
    other = plan.with_axes("embed", "model")
    Session(an, MESH, plan=other).export(path)
    assert tl.Plan.load(path, an) == other
    empty = tmp_path / "made_by_touch.json"
    empty.touch()
    assert tl.Plan.load(plan.save(empty, mesh=MESH), an) == plan
    with pytest.raises(IsADirectoryError, match="is a directory"):
        plan.save(tmp_path, overwrite=True)


def test_partition_refuses_out_over_a_users_file_before_the_search(user_module,
                                                                   monkeypatch, capsys):
    import toast_lab.cli as cli

    (user_module / "train.py").write_text("print('mine')\n")
    loaded = []
    real = cli.load_target
    monkeypatch.setattr(cli, "load_target", lambda *a: loaded.append(a) or real(*a))
    line = usage_error(["partition", "mlp", "--out", "train.py"], capsys)
    assert line == ("toast-lab: --out train.py exists and is not a toast-lab plan file: not "
                    "overwritten; pass --force to replace it, or choose another name"), line
    assert not loaded and (user_module / "train.py").read_text() == "print('mine')\n"
    assert main(["partition", "mlp", "--mesh", "data=8", "--budget", "0.2", "--out",
                 "train.py", "--force"]) == 0
    assert json.loads((user_module / "train.py").read_text())["format"] == "toast-lab-plan"


# --- Plan.load reads regular files only, and at most MAX_BYTES ------------------------------


def _load_within(seconds: float, path, an):
    """Plan.load(path, an) in a thread: a read that blocks fails the test instead of hanging."""
    result = {}

    def load():
        try:
            result["plan"] = tl.Plan.load(path, an)
        except Exception as err:  # noqa: BLE001 - handed to the test
            result["error"] = err

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"Plan.load({path}) blocked"
    return result


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_plan_load_refuses_a_fifo_without_blocking(an, tmp_path):
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    err = _load_within(10, fifo, an)["error"]
    assert isinstance(err, tl.PlanFileError)
    assert "plan.json: a FIFO (named pipe), not a plan file" in str(err)


@pytest.mark.parametrize("path, kind", [("/dev/zero", "a character device"),
                                        (None, "a directory")])
def test_plan_load_refuses_devices_and_directories(an, tmp_path, path, kind):
    path = path or tmp_path
    if not os.path.exists(path):
        pytest.skip(f"no {path} here")
    err = _load_within(10, path, an)["error"]
    assert isinstance(err, tl.PlanFileError) and f"{kind}, not a plan file" in str(err)


def test_plan_load_reads_at_most_its_limit(an, saved, monkeypatch):
    path, before = saved
    monkeypatch.setattr(_planfile, "MAX_BYTES", len(before) - 1)
    with pytest.raises(tl.PlanFileError, match=rf"more than {len(before) - 1} bytes is not a "
                                               rf"plan file"):
        tl.Plan.load(path, an)
    monkeypatch.setattr(_planfile, "MAX_BYTES", len(before))
    assert tl.Plan.load(path, an).class_axes == {"batch": ("data",)}


# --- plan files: errors name the field ------------------------------------------------------


def _edited(saved, edit):
    path, before = saved
    doc = json.loads(before)
    edit(doc)
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("edit, says", [
    (lambda d: d["mesh"]["axes"].update(data=3),
     r"the decisions do not fit the file's \"mesh\" section \(data=3, model=2\).*class 'batch' "
     r"has size 8.*not divisible by the 3 devices"),
    (lambda d: d["mesh"]["axes"].update(data=10**30),
     r"\"mesh\": axes .* make more than 1048576 devices"),
    (lambda d: d["mesh"].update(axes={}), r"\"mesh\" must look like .*named axes, positive"),
    (lambda d: d["mesh"]["axes"].update(data=-4), r"\"mesh\" must look like"),
    (lambda d: d["classes"].update(batch=["data", "data"]),
     r"the file's \"classes\" section, 'batch': mesh axes \('data', 'data'\) use an axis twice"),
    (lambda d: d["classes"].update(batch=["tensor"]),
     r"class 'batch' is sharded over 'tensor', which mesh \(data=4, model=2\) does not have"),
    (lambda d: d.update(conflicts={"batch@e @ e.T": "keep_dim2"}),
     r"the file's \"conflicts\" section: no conflict named"),
    (lambda d: d.update(overrides={"embed": {"optimizer": ["model", "model"]}}),
     r"the file's \"overrides\" section, 'embed@optimizer': mesh axes .* use an axis twice"),
])
def test_mesh_and_decision_errors_name_the_field(an, saved, edit, says):
    with pytest.raises(tl.PlanFileError, match=says):
        tl.Plan.load(_edited(saved, edit), an)


def test_a_bad_resolution_names_the_conflicts_section(an, saved):
    (conflict,) = an.conflicts
    path = _edited(saved, lambda d: d.update(conflicts={conflict.name: "keep_dim9"}))
    with pytest.raises(tl.PlanFileError, match=r"the file's \"conflicts\" section: conflict "
                                               r".* has no resolution 'keep_dim9'"):
        tl.Plan.load(path, an)


def test_a_device_no_preset_knows_is_said_not_dropped(an, saved):
    path = _edited(saved, lambda d: d["mesh"].update(device="my-own-chip"))
    with pytest.warns(tl.ToastWarning, match=r"names device 'my-own-chip', which is no preset"):
        plan = tl.Plan.load(path, an)
    assert plan.mesh is None and plan.class_axes == {"batch": ("data",)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tl.Plan.load(path, an, mesh=MESH).mesh is MESH  # the fix it names: no warning


@pytest.mark.parametrize("text, key", [
    ('"classes": {"batch": ["data"], "batch": []}', "batch"),
    ('"format": "toast-lab-plan", "format": "toast-lab-plan"', "format"),
])
def test_duplicate_keys_are_refused_naming_the_key(an, saved, text, key):
    path, before = saved
    doc = json.loads(before)
    head = {k: v for k, v in doc.items() if k not in ("classes", "format")}
    path.write_text("{" + text + ", " + json.dumps(head)[1:])
    with pytest.raises(tl.PlanFileError, match=rf"plan.json: the key '{key}' appears twice in "
                                               rf"one JSON object"):
        tl.Plan.load(path, an)


# --- pins: axis names before keywords, class names before overrides -------------------------


WORDY = tl.Mesh({"replicated": 2, "none": 4}, device="h100")


def test_an_axis_called_replicated_or_none_is_pinnable_in_the_session(an):
    s = Session(an, WORDY)
    assert s.pin("batch", ("replicated",)).axes_of("batch") == ("replicated",)
    assert s.pin("batch", "none").axes_of("batch") == ("none",)
    assert s.pin("batch", ["none"]).axes_of("batch") == ("none",)
    with pytest.raises(PinError, match=r"pin batch to 'replicated' is ambiguous: .* has an axis "
                                       r"called 'replicated'.*pin \('replicated',\) to shard "
                                       r"over that axis, or \(\) to replicate"):
        s.pin("batch", "replicated")
    assert s.plan.axes_of("batch") == ("none",)  # the refused pin changed nothing
    assert s.pin("batch", ()).axes_of("batch") == ()
    # where no axis is so called, the word still means replicated
    s = Session(an, MESH)
    s.pin("batch", "data")
    assert s.pin("batch", "replicated").axes_of("batch") == ()


def test_the_widgets_pin_message_names_axes_never_keywords(an):
    lab = tl.Lab.from_analysis(an, WORDY, widget=False)
    lab._on_event({"event": "pin", "name": "batch", "value": ["replicated"]})
    assert lab.plan.axes_of("batch") == ("replicated",) and lab.session.error is None
    lab._on_event({"event": "pin", "name": "batch", "value": []})
    assert lab.plan.axes_of("batch") == ()


def test_cli_pins_read_brackets_as_axis_names_and_call_a_bare_word_ambiguous():
    axes = ("data", "none", "replicated")
    assert _parse_pins(["batch=[none]", "embed=[data,replicated]", "features=[]"], axes) == {
        "batch": ("none",), "embed": ("data", "replicated"), "features": ()}
    assert _parse_pins(["batch=none", "embed=replicated", "features="], ("data",)) == {
        "batch": (), "embed": (), "features": ()}
    assert _parse_pins(["batch=data+none", "x@y=keep_dim2"], axes) == {
        "batch": ("data", "none"), "x@y": "keep_dim2"}
    from toast_lab.cli import UsageError

    with pytest.raises(UsageError, match=r"--pin batch=none is ambiguous: 'none' is an axis of "
                                         r"--mesh .* write --pin 'batch=\[none\]' for the "
                                         r"axis, or --pin batch= to replicate"):
        _parse_pins(["batch=none"], axes)


def test_partition_pins_an_axis_called_none(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["partition", "mlp", "--mesh", "none=8", "--pin", "batch=[none]", "--budget",
                 "0.2", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["classes"]["batch"] == ["none"]
    capsys.readouterr()
    assert "is ambiguous" in usage_error(["partition", "mlp", "--mesh", "none=8", "--pin",
                                          "batch=none"], capsys)


@pytest.fixture(scope="module")
def at_names():
    """Classes whose names hold '@': one ending in a domain's name, beside the class "out"."""
    def step(w, v, x):
        return jnp.tanh(x @ w).sum() + (v * v).sum()

    return tl.analyze(tl.trace(
        step, jax.ShapeDtypeStruct((16, 32), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.float32),
        jax.ShapeDtypeStruct((8, 16), jnp.float32),
        dim_names=(("feat@in", "out@parameters"), ("out",), ("batch", "feat@in"))))


def test_a_class_whose_name_holds_an_at_sign_is_pinnable(at_names):
    assert {c.name for c in at_names.classes} >= {"feat@in", "out@parameters", "out"}
    s = Session(at_names, MESH, tl.Plan.replicated(at_names))
    s.pin("feat@in", "data")
    s.pin("out@parameters", "model")  # the class of that exact name, not an override of "out"
    assert s.plan.class_axes == {"feat@in": ("data",), "out@parameters": ("model",)}
    assert not s.plan.overrides
    # an override of a class with '@' in its name: as a tuple, or split at the last '@'
    s.pin(("feat@in", "optimizer"), "model")
    s.pin("feat@in@parameters", ("data", "model"))
    assert s.plan.override_axes == {"feat@in@optimizer": ("model",),
                                    "feat@in@parameters": ("data", "model")}
    assert [c.name for c in s.history[-4:]] == ["feat@in", "out@parameters",
                                               "feat@in@optimizer", "feat@in@parameters"]
    s.unpin("out@parameters")
    s.unpin(("feat@in", "optimizer"))
    s.unpin("feat@in@parameters")
    assert s.pins == {"feat@in": ("data",)}
    with pytest.raises(PinError, match=r"no domain 'params'.*domains:"):
        s.pin(("out", "params"), "data")
    with pytest.raises(PinError, match=r"an override is named \(class name, domain\)"):
        s.pin(("out",), "data")


def test_the_history_is_bounded_and_keeps_its_start(an):
    s = Session(an, MESH, tl.Plan.replicated(an))
    for i in range(HISTORY_LIMIT):
        s.pin("batch", "data")
        s.unpin("batch")
    history = s.history
    assert len(history) == HISTORY_LIMIT
    assert history[0].action == "start" and history[0].plan == tl.Plan.replicated(an)
    assert [(c.action, c.name) for c in history[-2:]] == [("pin", "batch"), ("unpin", "batch")]
    assert history[-1].plan == s.plan


# --- export: the logical-axis rules say the overrides ---------------------------------------


def test_the_export_snippet_gives_each_overridden_domain_its_rules():
    fn, args = tl.zoo.get("mlp")
    mlp = tl.analyze(tl.trace(fn, *args))
    plan = (tl.Plan.replicated(mlp).with_axes("batch", "data")
            .with_axes("features", "data", domain="optimizer"))
    assert plan.logical_axis_rules_by_domain() == {"optimizer": plan.logical_axis_rules(
        "optimizer")}
    text = snippet(plan, MESH)
    assert "('features', None),  # optimizer: 'data' (LOGICAL_AXIS_RULES_BY_DOMAIN)" in text
    scope = {}
    exec(text[text.index("LOGICAL_AXIS_RULES = ["):], scope)  # the rules are valid Python
    assert dict(scope["LOGICAL_AXIS_RULES"])["features"] is None
    assert dict(scope["LOGICAL_AXIS_RULES_BY_DOMAIN"]["optimizer"]) == {
        "batch": "data", "features": "data", "hidden0": None, "hidden1": None, "classes": None}
    assert "LOGICAL_AXIS_RULES_BY_DOMAIN" not in snippet(tl.Plan.replicated(mlp), MESH)
    assert tl.Plan.replicated(mlp).logical_axis_rules_by_domain() == {}
