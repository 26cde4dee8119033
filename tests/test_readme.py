"""The README's examples run as written: the bring-your-own-step block is executed whole, and
the usage block is checked to call the API with arguments that fit together."""

import re
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_a_bring_your_own_step_example():
    assert "### Bring your own step" in README.read_text()
    assert any("def step(" in b for b in python_blocks())


@pytest.mark.slow
def test_bring_your_own_step_example_runs_as_written(capsys):
    block = next(b for b in python_blocks() if "def step(" in b)
    exec(compile(block, str(README) + ":bring-your-own-step", "exec"), {})
    out = capsys.readouterr().out
    assert "numerics: ok" in out and "sharding-equivalence classes" in out


def test_usage_example_verifies_with_the_sample_of_the_model_it_planned():
    usage = next(b for b in python_blocks() if "tl.zoo.get(" in b and "tl.verify(" in b)
    get = re.search(r'tl\.zoo\.get\("gpt", ([^)]*)\)', usage).group(1)
    sample = re.search(r'tl\.zoo\.sample\("gpt", ([^)]*)\)', usage).group(1)
    assert get == sample  # the README once verified GPT-2-small's plan on the tiny GPT's sample
