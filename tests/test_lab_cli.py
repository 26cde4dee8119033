"""`toast-lab lab`: writes a notebook that builds the Lab, then opens JupyterLab on it."""

import json
import os
import sys
import textwrap

import pytest

import toast_lab as tl
from toast_lab import cli
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


def _usage_error(argv, capsys) -> str:
    """The one line a usage error prints; asserts exit status 2 and nothing else printed."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("toast-lab: "), err
    return lines[0]


def test_lab_refuses_a_notebook_path_it_cannot_write(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "no" / "such" / "lab.ipynb"
    line = _usage_error(["lab", "--no-launch", "--notebook", str(missing)], capsys)
    assert f"directory {str(missing.parent)!r} does not exist; create it first" in line, line
    line = _usage_error(["lab", "--no-launch", "--notebook", str(tmp_path)], capsys)
    assert "is a directory; give a file name, e.g." in line, line
    assert not list(tmp_path.iterdir())


@pytest.fixture
def lab_module(tmp_path, monkeypatch):
    (tmp_path / "labsteps.py").write_text(textwrap.dedent("""
        import jax, jax.numpy as jnp

        def bare(w, x):
            return (x @ w).sum()

        def step(w, x):
            return jnp.tanh(x @ w).sum()

        step.example_args = (jax.ShapeDtypeStruct((16, 32), jnp.float32),
                             jax.ShapeDtypeStruct((8, 16), jnp.float32))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("labsteps", None)


@pytest.mark.parametrize("target", ["no_such_module_xyz:step", "labsteps:missing",
                                    "labsteps:bare"])
def test_lab_checks_a_module_target_before_writing_the_notebook(target, lab_module, capsys):
    expected = _usage_error(["partition", target], capsys)  # what partition says
    assert _usage_error(["lab", target, "--no-launch"], capsys) == expected
    assert not list(lab_module.glob("*.ipynb"))


def test_lab_on_a_module_target_imports_it_without_tracing(lab_module, monkeypatch, capsys):
    def trace(*args, **kwargs):
        raise AssertionError("lab traced the step before writing the notebook")

    monkeypatch.setattr(tl, "trace", trace)
    assert main(["lab", "labsteps:step", "--no-launch"]) == 0
    assert "wrote toast-lab-labsteps-step.ipynb" in capsys.readouterr().out
    assert "load_target('labsteps:step', {})" in _code(lab_module / "toast-lab-labsteps-step.ipynb")
