"""Where the kernel's compiled functions are cached: a directory named by a hash of the cost
model's sources.

numba's own cache (`cache=True`) keys each function on its own file's modification time. The
kernel is many small functions across modules that call each other and read constants from
other files (_plan_arrays.ORDER_SHIFT, _operand_rows' row kinds), and numba compiles a callee into
its callers: edit a phase or a constant and every function compiled with the old one keeps
running the old code from the cache. So every kernel function is cached under
`<base>/<hash of every source file of toast_lab/cost>/`, and its freshness stamp is that hash:
any edit to the cost model starts a new cache, and a stale one is never read.

`<base>` is NUMBA_CACHE_DIR (numba's setting) when it is set, else a `__pycache__/kernel` folder
beside this file when that is writable (older hash folders there are removed), else the user's
cache folder ($XDG_CACHE_HOME or ~/.cache, under toast_lab/numba).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from pathlib import Path

from numba.core import caching, config

COST_PACKAGE = Path(__file__).resolve().parents[1]  # toast_lab/cost


def sources_hash(root: Path = COST_PACKAGE) -> str:
    """A hash of every Python source file under `root` (paths and contents)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def _current_hash() -> str:
    return sources_hash()


def cache_base() -> tuple[Path, bool]:
    """(the folder the hash folders go in, whether other hash folders there may be removed)."""
    if config.CACHE_DIR:
        return Path(config.CACHE_DIR) / "toast_lab", False
    in_tree = Path(__file__).resolve().parent / "__pycache__" / "kernel"
    try:
        in_tree.mkdir(parents=True, exist_ok=True)
        if os.access(in_tree, os.W_OK):
            return in_tree, True
    except OSError:
        pass
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return user / "toast_lab" / "numba", False


@functools.lru_cache(maxsize=None)
def cache_dir() -> Path:
    """The folder the kernel's compiled functions are cached in (made, and older ones removed
    where the folder is the kernel's own)."""
    base, prunable = cache_base()
    path = base / _current_hash()
    path.mkdir(parents=True, exist_ok=True)
    if prunable:
        for other in base.iterdir():
            if other.is_dir() and other.name != path.name:
                shutil.rmtree(other, ignore_errors=True)
    return path


class SourceHashLocator(caching._CacheLocator):
    """numba's cache locator for the kernel's functions (see the module docstring)."""

    def __init__(self, py_func, py_file):
        self._lineno = py_func.__code__.co_firstlineno
        self._path = str(cache_dir())

    def get_cache_path(self):
        return self._path

    def get_source_stamp(self):
        return _current_hash()

    def get_disambiguator(self):
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):
        if not py_func.__module__.startswith(__package__ + "."):
            return None
        self = cls(py_func, py_file)
        try:
            self.ensure_cache_path()
        except OSError:
            return None
        return self


def install() -> None:
    """Puts SourceHashLocator first among numba's cache locators (once)."""
    if SourceHashLocator not in caching.CacheImpl._locator_classes:
        caching.CacheImpl._locator_classes.insert(0, SourceHashLocator)
