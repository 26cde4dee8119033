"""The command line: analyze and partition on a zoo model and on a user's module:function."""

import json
import sys
import textwrap

import pytest

import toast_lab as tl
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


def test_unknown_targets_are_clear_errors():
    with pytest.raises(SystemExit, match="unknown model 'gtp'"):
        main(["analyze", "gtp"])
    with pytest.raises(SystemExit, match="cannot import"):
        main(["analyze", "no_such_module_xyz:step"])


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
    with pytest.raises(SystemExit, match="--mesh looks like"):
        main(["partition", "mlp", "--mesh", "data4"])
    with pytest.raises(SystemExit, match="name no class"):
        main(["partition", "mlp", "--mesh", "data=8", "--pin", "bogus=data", "--budget", "1"])
