"""The command line: analyze and partition on a zoo model and on a user's module:function."""

import json
import sys
import textwrap

import pytest

import toast_lab as tl
from tests.cli_support import usage_error
from toast_lab.cli import main


def test_analyze_a_zoo_model(capsys):
    assert main(["analyze", "gpt", "-c", "layers=2"]) == 0
    out = capsys.readouterr().out
    assert "sharding-equivalence classes" in out and "'seq' twice" in out
    assert "analysed in" in out


def test_analyze_a_users_module_function(tmp_path, monkeypatch, capsys):
    (tmp_path / "mytrain.py").write_text(textwrap.dedent("""
        import jax, jax.numpy as jnp

        def step(w, x):
            return jnp.tanh(x @ w).sum()

        step.example_args = (jax.ShapeDtypeStruct((16, 32), jnp.float32),
                             jax.ShapeDtypeStruct((8, 16), jnp.float32))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "mytrain:step"]) == 0
    assert "step: 3 ops" in capsys.readouterr().out
    sys.modules.pop("mytrain", None)


def test_unknown_targets_are_clear_errors(capsys):
    assert "unknown model 'gtp'" in usage_error(["analyze", "gtp"], capsys)
    assert "cannot import" in usage_error(["analyze", "no_such_module_xyz:step"], capsys)


def test_partition_writes_a_plan_that_loads(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = main(["partition", "gpt", "-c", "size=gpt2-small", "-c", "layers=2",
                 "--mesh", "data=4,model=2", "--device", "h100", "--budget", "1",
                 "--pin", "batch=data", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    for name in ("dp", "fsdp", "megatron", "search"):
        assert name in text
    doc = json.loads(out.read_text())
    assert doc["classes"]["batch"] == ["data"] and doc["estimate"]["feasible"]
    fn, args = tl.zoo.get("gpt", size="gpt2-small", layers=2)
    plan = tl.Plan.load(out, tl.analyze(tl.trace(fn, *args)))
    assert plan.axes_of("batch") == ("data",) and "batch" in plan.pinned


def test_partition_bad_mesh_and_pins(capsys):
    assert "--mesh looks like" in usage_error(["partition", "mlp", "--mesh", "data4"], capsys)
    assert "name no class" in usage_error(
        ["partition", "mlp", "--mesh", "data=8", "--pin", "bogus=data", "--budget", "1"], capsys)


@pytest.mark.parametrize("argv, says", [
    (["analyze", "usersteps:bare"], "has no example arguments: give it an `example_args`"),
    (["analyze", ":step"], "give package.module:function"),
    (["analyze", "mlp", "-c", "batch=abc"], "'batch' takes an int"),
    (["analyze", "gpt", "-c", "hidden=128"], "takes no config key 'hidden'; its keys:"),
    (["analyze", "usersteps:factory", "-c", "hidden=128"], "takes no config key 'hidden'"),
    (["analyze", "usersteps:step", "-c", "width=8"], "nothing to configure"),
    (["analyze", "usersteps:broken"], "tracing usersteps:broken failed: TypeError"),
    (["analyze", "mlp", "-c", "layers"], "look like -c key=value"),
    (["analyze", "mlp", "--max-classes", "0"], "positive number of rows"),
    (["partition", "mlp", "--device", "tpu9"], "no such device preset; choose one of"),
    (["partition", "mlp", "--mesh", "data=4,data=2"], "axis 'data' appears twice"),
    (["partition", "mlp", "--mesh", "data=0"], "positive sizes"),
    (["partition", "mlp", "--pin", "batch=data+data"], "axis 'data' is repeated"),
    (["partition", "mlp", "--out", "no/such/dir/plan.json"], "does not exist; create it first"),
    (["partition", "mlp", "--budget", "abc"], "invalid float value"),
    (["partition", "mlp", "--budget", "-1"], "positive number of seconds"),
    # what float() and str.isdigit() accept but the search and int() do not: no traceback
    (["partition", "mlp", "--budget", "inf"], "give a finite, positive number of seconds"),
    (["partition", "mlp", "--memory-cap", "inf"], "finite, positive number of bytes per device"),
    (["partition", "mlp", "--memory-cap", "1e400"], "finite, positive number of bytes"),
    (["partition", "mlp", "--mesh", "data=\u00b2"], "--mesh looks like data=4,model=2"),
    (["analyze", "mlp", "-c", "hidden=\u00b2"], "'hidden' takes integers separated by commas"),
    (["partition", "mlp", "--seed", "-1"], "--seed -1: give a non-negative integer"),
    (["partition", "mlp", "--out", ""], "--out '': give a file name"),
    (["partition", "mlp", "--out", "plans/"], "directory 'plans/' does not exist"),
    (["analyze", "mlp", "-c", "batch=-3"], "'batch' is a size or a count; give a non-negative"),
    (["analyze", "mlp", "-c", "learning_rate=nan"], "'learning_rate' takes a finite number"),
    (["analyze", "gpt", "-c", "heads=0"], "heads=0"),
    (["analyze", ".usersteps:step"], "relative module names are not supported"),
    (["analyze", "importfails:step"], "importing importfails failed: ZeroDivisionError"),
    (["analyze", "syntaxfails:step"], "importing syntaxfails failed: SyntaxError"),
    (["analyze", "usersteps:lazy_fails"],
     "usersteps:lazy_fails.example_args() failed: ZeroDivisionError: division by zero (at "),
    (["analyze", "usersteps:factory_fails"],
     "calling usersteps:factory_fails as a factory failed: ValueError: width 16 is not a "),
])
def test_every_usage_error_is_one_line_and_exit_status_2(argv, says, user_module, capsys):
    line = usage_error(argv, capsys)
    assert says in line, line


def test_out_into_a_missing_directory_fails_before_the_search(user_module, capsys):
    started = []
    import toast_lab.cli as cli

    real = cli.load_target
    cli.load_target = lambda *a: started.append(a) or real(*a)
    try:
        usage_error(["partition", "mlp", "--out", "missing/plan.json"], capsys)
    finally:
        cli.load_target = real
    assert not started  # the model was never even loaded


def test_a_zoo_model_that_fails_to_build_is_one_line(monkeypatch, capsys):
    def get(name, **config):  # as a config value the model's own checks miss would
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(tl.zoo, "get", get)
    line = usage_error(["analyze", "cnn", "-c", "kernel=0"], capsys)
    assert "building cnn -c kernel=0 failed: ZeroDivisionError" in line, line


def test_a_plan_the_disk_refuses_is_one_line(tmp_path, monkeypatch, capsys):
    def save(self, path, **kwargs):  # checked before the search; the disk can still refuse
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(tl.Plan, "save", save)
    with pytest.raises(SystemExit) as exit_info:
        main(["partition", "mlp", "--budget", "0.2", "--out", str(tmp_path / "plan.json")])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]  # after the search's progress bar
    assert last.startswith("toast-lab: --out ") and "cannot write the plan: Permission denied" \
        in last, last


def test_strict_and_no_group_do_what_they_say(tmp_path, monkeypatch, capsys):
    (tmp_path / "cbstep.py").write_text(textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np

        def step(w, x):
            y = jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
            return (y @ w).sum()

        step.example_args = (jax.ShapeDtypeStruct((16, 32), jnp.float32),
                             jax.ShapeDtypeStruct((8, 16), jnp.float32))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert "pure_callback" in usage_error(["analyze", "cbstep:step", "--strict"], capsys)
    assert main(["analyze", "cbstep:step"]) == 0
    assert "pure_callback x1 (no rule)" in capsys.readouterr().out
    sys.modules.pop("cbstep", None)
    assert main(["analyze", "gpt", "-c", "layers=2"]) == 0
    grouped = capsys.readouterr().out
    assert main(["analyze", "gpt", "-c", "layers=2", "--no-group"]) == 0
    ungrouped = capsys.readouterr().out
    assert "(layers grouped)" in grouped and "(layers grouped)" not in ungrouped


GPT_SCAN = ["gpt_scan", "-c", "layers=4", "-c", "batch=16", "-c", "seq=64",
            "--mesh", "stage=2,data=2,model=2", "--device", "h100"]


def test_partition_pins_pipeline_stages(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = main(["partition", *GPT_SCAN, "--budget", "1", "--pin", "pipeline@block=stage:2",
                 "--micro-batches", "4", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert ("pipeline@block: 2 stages over mesh axis 'stage', 2 of 4 layers each; 4 "
            "micro-batches, gpipe: bubble 1/5 = 20% of each loop") in text
    assert "hand-offs: 10 collective-permutes over 'stage' per step" in text
    fn, args = tl.zoo.get("gpt_scan", layers=4, batch=16, seq=64)
    plan = tl.Plan.load(out, tl.analyze(tl.trace(fn, *args)))
    assert plan.step.pipeline == tl.plan.Pipeline("block", "stage", 2)
    assert {"pipeline@block", "micro_batches"} <= plan.pinned
    # "none" keeps the stack whole, whatever the search would prefer
    assert main(["partition", *GPT_SCAN, "--budget", "0.5", "--pin", "pipeline@block=none",
                 "--out", str(out)]) == 0
    assert "pipeline@block" not in capsys.readouterr().out
    plan = tl.Plan.load(out, plan.analysis)
    assert plan.step.pipeline is None and "pipeline@block" in plan.pinned


@pytest.mark.parametrize("flags,says", [
    (["--pin", "pipeline@block=stage:3"], "--pin pipeline@block=stage:3: pipeline@block: 3 "
                                          "stages do not divide its 4 layers evenly"),
    (["--pin", "pipeline@block=pipe:2"], "--pin pipeline@block=pipe:2: the mesh has no axis "
                                         "'pipe'"),
    (["--pin", "pipeline@block=stage:x"], 'stages are written "<mesh axis>:<stages>" (e.g. '
                                          '"stage:4"), "<mesh axis>:<stages>x<runs>" for a '
                                          'circular schedule'),
    (["--pin", "pipeline@block=stage:2x2", "--micro-batches", "1"],
     "a circular schedule sends each micro-batch round the 2 stages again, so it needs at "
     "least 2 micro-batches; the plan has 1"),
    (["--pin", "pipeline@embed=stage:2"], "stages cut a scanned layer stack"),
    (["--pin", "pipeline@block"], "a pipeline pin looks like pipeline@<layer group>=<mesh "
                                  "axis>:<stages>"),
])
def test_pipeline_pins_the_step_cannot_take_are_usage_errors(flags, says, capsys):
    line = usage_error(["partition", *GPT_SCAN, "--budget", "1", *flags], capsys)
    assert says in line, line
