"""`toast-lab lab`: writes a notebook that builds the Lab, then opens JupyterLab on it."""

import json
import os
import sys

import pytest

import toast_lab as tl
from toast_lab import cli
from tests.cli_support import usage_error
from toast_lab.cli import main


def _code(path) -> str:
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4 and nb["metadata"]["kernelspec"]["name"] == "python3"
    return "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])


def test_lab_writes_a_notebook_whose_first_cell_builds_the_lab(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["lab", "-c", "size=tiny", "-c", "layers=2", "--mesh", "data=2,model=2",
                 "--no-launch", "--no-browser"]) == 0
    out = capsys.readouterr().out
    path = tmp_path / "toast-lab-gpt.ipynb"
    assert "wrote toast-lab-gpt.ipynb" in out
    assert f"{sys.executable} -m jupyterlab toast-lab-gpt.ipynb" in out and "--no-browser" in out
    if os.geteuid() == 0:
        assert "--allow-root" in out
    code = _code(path)
    assert "tl.zoo.get('gpt', size='tiny', layers=2)" in code
    assert code.rstrip().endswith("lab")
    scope = {}
    exec(compile(code.replace("\nlab", "\nlab_shown = lab"), str(path), "exec"), scope)
    lab = scope["lab"]
    assert isinstance(lab, tl.Lab) and dict(lab.mesh.shape) == {"data": 2, "model": 2}
    assert lab.estimate.step_time_s > 0


def test_lab_defaults_to_gpt2_small_and_keeps_an_existing_notebook(tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    assert main(["lab"]) == 0
    path = tmp_path / "toast-lab-gpt.ipynb"
    assert "size='gpt2-small'" in _code(path) and "device='h100'" in _code(path)
    assert calls and calls[0][1:4] == ["-m", "jupyterlab", "toast-lab-gpt.ipynb"]
    path.write_text(path.read_text().replace("gpt2-small", "gpt2-medium"))
    assert main(["lab", "--", "--port", "8899"]) == 0
    assert "gpt2-medium" in _code(path)  # not overwritten
    assert "opening the existing notebook" in capsys.readouterr().out
    assert calls[1][-2:] == ["--port", "8899"]


def test_lab_refuses_a_notebook_path_it_cannot_write(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "no" / "such" / "lab.ipynb"
    line = usage_error(["lab", "--no-launch", "--notebook", str(missing)], capsys)
    assert f"directory {str(missing.parent)!r} does not exist; create it first" in line, line
    line = usage_error(["lab", "--no-launch", "--notebook", str(tmp_path)], capsys)
    assert "is a directory; give a file name, e.g." in line, line
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("target", ["no_such_module_xyz:step", "usersteps:missing",
                                    "usersteps:bare"])
def test_lab_checks_a_module_target_before_writing_the_notebook(target, user_module, capsys):
    expected = usage_error(["partition", target], capsys)  # what partition says
    assert usage_error(["lab", target, "--no-launch"], capsys) == expected
    assert not list(user_module.glob("*.ipynb"))


def test_lab_on_a_module_target_imports_it_without_tracing(user_module, monkeypatch, capsys):
    def trace(*args, **kwargs):
        raise AssertionError("lab traced the step before writing the notebook")

    monkeypatch.setattr(tl, "trace", trace)
    assert main(["lab", "usersteps:step", "--no-launch"]) == 0
    assert "wrote toast-lab-usersteps-step.ipynb" in capsys.readouterr().out
    assert "load_target('usersteps:step', {})" in _code(user_module / "toast-lab-usersteps-step.ipynb")


def test_the_notebook_for_a_module_target_runs_its_step_and_verifies_it(user_module, capsys):
    """Every code cell of the notebook, run here in order: the Lab, the export, the step
    sharded by the plan on arrays drawn for the example shapes, and tl.verify."""
    assert main(["lab", "usersteps:step", "--no-launch"]) == 0
    nb = json.loads((user_module / "toast-lab-usersteps-step.ipynb").read_text())
    code = [("".join(c["source"]), c["id"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert len(code) == 5 and "plan.jit(fn" in code[3][0] and "tl.verify(" in code[4][0]
    capsys.readouterr()
    scope = {}
    for source, cell_id in code:
        exec(compile(source, cell_id, "exec"), scope)
    out = capsys.readouterr().out
    assert "wrote toast-lab-usersteps-step.plan.json" in out
    assert "the step ran sharded over 8 devices (output arrays: 1)" in out
    assert scope["report"].numerics_ok and "numerics: ok" in out
    assert tl.Plan.load(user_module / "toast-lab-usersteps-step.plan.json",
                        scope["lab"].analysis) == scope["lab"].plan
