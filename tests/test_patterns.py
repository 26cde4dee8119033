"""The table of the XLA partitioner's patterns (cost/_kernel/_patterns.py): every pattern has a
code of its own, a name of its own, the XLA function it models, and a test against XLA that
exists and asserts that the pattern charged its reproducer's collectives (so no pattern loses
its test silently)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from toast_lab.cost._kernel import PATTERN_NAMES, PATTERNS, _patterns

ROOT = Path(__file__).resolve().parent.parent

# code -> the name of its constant in _patterns (PARTIAL_SUMS = 0, ...)
CONSTANTS = {value: name for name, value in vars(_patterns).items()
             if name.isupper() and type(value) is int and name != "NUM_PATTERNS"}


def test_codes_count_from_zero_and_codes_and_names_are_unique():
    assert [p.code for p in PATTERNS] == list(range(_patterns.NUM_PATTERNS))
    assert sorted(CONSTANTS) == list(range(len(PATTERNS))), "one constant per code"
    assert len(set(PATTERN_NAMES)) == len(PATTERNS)
    assert all(p.xla and p.summary for p in PATTERNS)


def _test_source(reference: str) -> str | None:
    """The source of the test function "tests/<file>.py::<test>" names (None: none there)."""
    path, name = reference.split("::")
    if not (ROOT / path).is_file():
        return None
    source = (ROOT / path).read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(source, node)
    return None


def _problems(pattern) -> list[str]:
    """What is wrong with `pattern`'s test reference: none where it names a test function
    that exists, names the pattern's constant and reads the patterns of the charges."""
    if not re.fullmatch(r"tests/test_\w+\.py::test_\w+", pattern.test):
        return [f"{pattern.test!r} is not tests/<file>.py::<test>"]
    source = _test_source(pattern.test)
    if source is None:
        return [f"no test {pattern.test}"]
    constant = CONSTANTS[pattern.code]
    found = []
    if not re.search(rf"\b{constant}\b", source):
        found.append(f"{pattern.test} does not name {constant}")
    if "patterns_charged(" not in source:
        found.append(f"{pattern.test} reads no charge's patterns")
    return found


@pytest.mark.parametrize("pattern", PATTERNS, ids=[CONSTANTS[p.code] for p in PATTERNS])
def test_every_pattern_names_a_test_that_asserts_it(pattern):
    assert _problems(pattern) == [], pattern.name


def test_a_test_that_is_missing_or_asserts_another_pattern_is_caught():
    halo = PATTERNS[_patterns.HALO_EXCHANGE]
    assert _problems(halo._replace(test="tests/test_cost_halo.py::test_gone")) == [
        "no test tests/test_cost_halo.py::test_gone"]
    assert _problems(halo._replace(test="tests/test_cost_halo.py:test_gone")) != []
    # the argmax test asserts VARIADIC_REDUCE, not HALO_EXCHANGE
    other = PATTERNS[_patterns.VARIADIC_REDUCE].test
    assert _problems(halo._replace(test=other)) == [f"{other} does not name HALO_EXCHANGE"]
