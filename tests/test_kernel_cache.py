"""The kernel's numba cache follows the code (cost/_kernel/_cache.py): it lives in a folder
named by a hash of the cost model's sources, so an edit anywhere in toast_lab/cost (a constant
another file imports included) starts a new cache and the old one is never read."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import toast_lab
from toast_lab.cost._kernel import _cache, _driver

PACKAGE = Path(toast_lab.__file__).resolve().parent

# compiles (or loads) one small kernel function in a fresh interpreter and reports where its
# cache went and whether numba read it from there
_PROBE = """
import json
import numpy as np
from toast_lab.cost._kernel import _cache
from toast_lab.cost._kernel._charge import gather_time
from toast_lab.cost._tables import MESH
mesh = np.zeros(2, MESH)
mesh[1] = (4.0, 1e-9, 1e-6, 0.0, 0.0, 0.0)
seconds = gather_time(1000.0, 1, mesh)
print(json.dumps({"dir": str(_cache.cache_dir()), "seconds": seconds,
                  "hits": sum(gather_time.stats.cache_hits.values()),
                  "misses": sum(gather_time.stats.cache_misses.values())}))
"""


def _probe(root: Path, cache: Path) -> dict:
    # (no kernel compiled ahead: its compile would hold numba's lock, and the probe wait for it)
    env = dict(os.environ, PYTHONPATH=str(root), NUMBA_CACHE_DIR=str(cache),
               TOAST_LAB_COMPILE_AHEAD="0")
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, cwd=root, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_hash_covers_every_cost_source_a_constant_edit_included(tmp_path):
    cost = tmp_path / "cost"
    shutil.copytree(PACKAGE / "cost", cost, ignore=shutil.ignore_patterns("__pycache__"))
    before = _cache.sources_hash(cost)
    assert before == _cache.sources_hash(PACKAGE / "cost")  # (paths relative to the package)
    tables = cost / "_tables.py"
    text = tables.read_text()
    tables.write_text(text.replace("_I, _F = np.int64, np.float64",
                                   "_I, _F = np.int64, np.float32"))
    assert _cache.sources_hash(cost) != before
    tables.write_text(text)
    assert _cache.sources_hash(cost) == before
    (cost / "_kernel" / "_new_phase.py").write_text("X = 1\n")
    assert _cache.sources_hash(cost) != before


def test_every_kernel_function_is_cached_under_the_hash():
    locator = _driver._entry._cache._impl.locator
    assert isinstance(locator, _cache.SourceHashLocator)
    assert Path(locator.get_cache_path()) == _cache.cache_dir()
    assert _cache.cache_dir().name == _cache.sources_hash()
    assert locator.get_source_stamp() == _cache.sources_hash()
    # functions outside the kernel keep numba's own locators
    assert _cache.SourceHashLocator.from_function(json.dumps, json.__file__) is None


def test_an_edit_to_another_cost_file_starts_a_new_cache(tmp_path):
    """A function compiled once is read back from the cache in the next interpreter; after an
    edit to a file it does not import, it is compiled afresh into a new folder."""
    root, cache = tmp_path / "src", tmp_path / "cache"
    shutil.copytree(PACKAGE, root / "toast_lab", ignore=shutil.ignore_patterns("__pycache__"))
    first = _probe(root, cache)
    assert first["misses"] == 1 and first["hits"] == 0
    assert Path(first["dir"]).parent == cache / "toast_lab"
    assert any(Path(first["dir"]).glob("*gather_time*.nbi"))
    again = _probe(root, cache)
    assert (again["hits"], again["misses"], again["dir"]) == (1, 0, first["dir"])
    manual = root / "toast_lab" / "cost" / "_manual.py"
    manual.write_text(manual.read_text() + "\n# an edit\n")
    edited = _probe(root, cache)
    assert edited["dir"] != first["dir"]
    assert (edited["hits"], edited["misses"]) == (0, 1)
    assert edited["seconds"] == first["seconds"] == 1000.0 * 1e-9 + 1e-6
