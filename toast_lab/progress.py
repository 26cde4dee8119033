"""Progress of long steps (tracing, analysing, compiling the cost model, the first view), told
to whoever listens in the current context.

A listener is any callable taking a `ProgressEvent`. `reporting(listener)` makes it the one for
the code run inside (this thread, and whatever runs in its context: a context variable), e.g.
the Lab's cell output while `tl.Lab(...)` builds. Code doing the work says what it does with
`stage(...)` whether or not anyone listens (no listener: one context-variable read), so the
code that shows progress and the code that reports it need not know each other:

    with progress.reporting(print):
        with progress.stage("analyze", "analysing the dataflow") as s:
            an = tl.analyze(program)
            s.detail = f"{len(an.classes)} classes"

While a listener is installed, numba compiling one of toast_lab's functions (a cache miss: the
cost model's kernel on a first run) is reported as the stage COMPILE, from numba's event API,
so the kernel's first use is seen without code of its own. Work that waits for a compile made
elsewhere (another thread, another process) reports it with `stage(*COMPILE)`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

log = logging.getLogger("toast_lab.progress")

STATES = ("start", "done", "failed")

# Whose numba compiles are reported (functions of modules under this prefix).
COMPILED_MODULES = "toast_lab."
# The stage numba's compiles of toast_lab's functions are reported as: (key, message, note).
# The cost model's kernel is toast_lab's only numba code; from empty caches it takes about 40 s
# of CPU (benchmarks/lab_latency.py, cold start), begun at the import (cost/_kernel/_ahead.py).
COMPILE = ("compile", "compiling the cost model",
           "first run only, about 40 s of CPU; numba caches it for the next runs")


@dataclass(frozen=True)
class ProgressEvent:
    """A stage starting or ending.

    key: what kind of work ("trace", "analyze", "compile", ...); message: what is happening,
    in words ("compiling the cost model"); note: what to expect ("first run only, ..."), or "";
    state: "start", "done" or "failed"; elapsed_s: seconds since the stage started (0 at its
    start); detail: what it found, once done ("8 classes, 2 conflicts"), or the error when it
    failed; depth: how many stages it runs inside (0: the outermost).
    """

    key: str
    message: str
    state: str
    elapsed_s: float = 0.0
    note: str = ""
    detail: str = ""
    depth: int = 0


Listener = Callable[[ProgressEvent], object]

_listener: ContextVar[Listener | None] = ContextVar("toast_lab_progress_listener", default=None)
_depth: ContextVar[int] = ContextVar("toast_lab_progress_depth", default=0)


def _tell(listener: Listener, event: ProgressEvent) -> None:
    """Gives `event` to `listener`; a listener that fails is logged, never the work's problem."""
    try:
        listener(event)
    except Exception:  # noqa: BLE001 - progress must not break what it reports on
        log.exception("toast-lab: a progress listener failed on %r", event)


class StageRun:
    """The stage under way, as `stage(...)` yields it: set `detail` to say what it found."""

    def __init__(self) -> None:
        self.detail = ""
        self.started = time.perf_counter()

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started


@contextlib.contextmanager
def stage(key: str, message: str, note: str = "") -> Iterator[StageRun]:
    """Reports `message` as started, then done (with `detail` and its time) or failed (with the
    error, which propagates), to the listener of this context, if any."""
    run = StageRun()
    listener = _listener.get()
    if listener is None:
        yield run
        return
    depth = _depth.get()
    _tell(listener, ProgressEvent(key, message, "start", 0.0, note, "", depth))
    token = _depth.set(depth + 1)
    try:
        yield run
    except BaseException as err:
        _depth.reset(token)
        _tell(listener, ProgressEvent(key, message, "failed", run.elapsed_s, note,
                                      f"{type(err).__name__}: {err}", depth))
        raise
    _depth.reset(token)
    _tell(listener, ProgressEvent(key, message, "done", run.elapsed_s, note, run.detail, depth))


@contextlib.contextmanager
def reporting(listener: Listener | None) -> Iterator[None]:
    """Makes `listener` the one told of every stage run inside (None: nobody), numba's
    compiles of toast_lab's functions on this thread included."""
    token = _listener.set(listener)
    try:
        with _numba_compiles(listener):
            yield
    finally:
        _listener.reset(token)


def _numba_compiles(listener: Listener | None):
    """numba's "numba:compile" events for toast_lab's functions on this thread, as stages."""
    try:
        from numba.core import event
    except ImportError:
        return contextlib.nullcontext()
    if listener is None:
        return contextlib.nullcontext()

    class Compiles(event.Listener):
        """The outermost compile of a toast_lab function is the stage; the functions it
        compiles on the way (numba compiles callees first) are part of it. Its end is "done"
        either way: a compile that fails raises, and the stage around it says so."""

        def __init__(self) -> None:
            self.thread = threading.get_ident()
            self.nested = 0
            self.started = 0.0
            self.depth = 0

        def _ours(self, ev) -> bool:
            dispatcher = (ev.data or {}).get("dispatcher")
            module = getattr(getattr(dispatcher, "py_func", None), "__module__", "") or ""
            return threading.get_ident() == self.thread and module.startswith(COMPILED_MODULES)

        def on_start(self, ev) -> None:
            if self._ours(ev):
                self.nested += 1
                if self.nested == 1:
                    self.started, self.depth = time.perf_counter(), _depth.get()
                    _tell(listener, ProgressEvent(*COMPILE[:2], "start", 0.0, COMPILE[2],
                                                  "", self.depth))

        def on_end(self, ev) -> None:
            if self._ours(ev) and self.nested > 0:
                self.nested -= 1
                if self.nested == 0:
                    _tell(listener, ProgressEvent(*COMPILE[:2], "done",
                                                  time.perf_counter() - self.started,
                                                  COMPILE[2], "", self.depth))

    return event.install_listener("numba:compile", Compiles())
