"""Compiling the kernel ahead of its first use, on a thread of its own.

From empty caches numba compiles the kernel (its one entry, _driver._entry, and the state's
constructor) in about 40 s of CPU; every later run loads it from the on-disk cache
(_cache.py) in well under a second. The kernel's types do not depend on the program (every
model's ModelState has one numba type), so the compile needs no model of the user's: `start`
begins it on a daemon thread for a two-op program, from `import toast_lab` on, and it runs
while the user writes the next cell, traces and analyses. `wait`, called before a cost model
first calls compiled code, waits for it and says so (the stage progress.COMPILE); without it,
numba's compiler lock would make that call wait all the same, silently. Nothing is compiled
twice: the thread compiles the signature every Python entry calls (_driver.entry_types).

Nothing starts when the kernel is compiled in this process or cached on disk already, or when
the environment sets TOAST_LAB_COMPILE_AHEAD=0 (the kernel then compiles at its first use).
While the thread compiles, numba compiles nothing else in the process (its compiler lock is
global): a user's own @njit function compiled meanwhile waits for it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from ...progress import COMPILE, stage
from . import _driver, _state

log = logging.getLogger("toast_lab.cost")

# "0" in the environment: no compile ahead; the kernel compiles at its first use.
ENV = "TOAST_LAB_COMPILE_AHEAD"

_lock = threading.Lock()
_thread: threading.Thread | None = None
_done = threading.Event()
_began: float | None = None  # time.perf_counter() when `start` began the compile


def cached() -> bool:
    """Whether the kernel is compiled in this process, or its entries are in numba's cache."""
    if _driver._entry.signatures:
        return True
    try:  # (numba's own cache objects: _cache.py installs the locator they use)
        return all(Path(f._cache._cache_file._index_path).exists()
                   for f in (_driver._entry, _state._new_state))
    except AttributeError:  # another numba's internals: compile ahead all the same
        return False


def start() -> bool:
    """Begins compiling the kernel on a daemon thread (see the module docstring); False where
    nothing began: compiled or cached already, begun already, or turned off by ENV."""
    global _thread, _began
    if os.environ.get(ENV, "1").strip() == "0":
        return False
    with _lock:
        if _thread is not None or cached():
            return False
        _thread = threading.Thread(target=_compile, name="toast-lab kernel compile",
                                   daemon=True)
        _began = time.perf_counter()
        _thread.start()
    return True


def running() -> bool:
    """Whether a compile `start` began is still under way."""
    return _thread is not None and not _done.is_set()


def elapsed_s() -> float | None:
    """Seconds since `start` began the compile (None where it began none)."""
    return None if _began is None else time.perf_counter() - _began


def done(timeout: float = 0.0) -> bool:
    """Whether no compile `start` began is under way, after waiting up to `timeout` seconds for
    the one that is (quietly: `wait` is the waiting that reports itself)."""
    return not running() or _done.wait(timeout)


def wait() -> None:
    """Waits for the compile `start` began, if one is under way on another thread, reporting
    it as the stage progress.COMPILE to this context's listener."""
    if not running() or _thread is threading.current_thread():
        return
    with stage(*COMPILE):
        _done.wait()


def _compile() -> None:
    try:
        _driver._entry.compile(_driver.entry_types(tiny_state()))
    except Exception:  # noqa: BLE001 - the kernel then compiles at its first use
        log.warning("toast-lab: compiling the cost model ahead failed; it compiles at its "
                    "first use instead", exc_info=True)
    finally:
        _done.set()


def tiny_state():
    """The ModelState of a two-op step (a matmul and its sum) on two CPU devices: a state
    with the numba type of every model's, built in a fraction of a second (its constructor
    compiled on the way)."""
    import jax
    import jax.numpy as jnp

    from ...analysis import analyze
    from ...plan import Mesh
    from ...program import trace
    from .._model import CostModel

    def step(w, x):
        return jnp.tanh(x @ w).sum()

    program = trace(step, jax.ShapeDtypeStruct((8, 8), jnp.float32),
                    jax.ShapeDtypeStruct((4, 8), jnp.float32))
    return CostModel(analyze(program), Mesh({"data": 2}, device="cpu")).state
