"""toast_lab.progress: stages told to the listener of the context, numba's compiles included."""

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from toast_lab import progress
from toast_lab.progress import ProgressEvent, reporting, stage


def _states(events):
    return [(e.key, e.state, e.depth) for e in events]


def test_stages_are_told_to_the_listener_with_depth_detail_and_failure():
    events = []
    with reporting(events.append):
        with stage("outer", "doing the outer thing") as run:
            with stage("inner", "doing the inner thing", note="takes a while"):
                pass
            run.detail = "3 things"
        with pytest.raises(ValueError, match="no good"):
            with stage("bad", "failing"):
                raise ValueError("no good")
    assert _states(events) == [("outer", "start", 0), ("inner", "start", 1), ("inner", "done", 1),
                               ("outer", "done", 0), ("bad", "start", 0), ("bad", "failed", 0)]
    assert events[1].note == "takes a while"
    assert events[3].detail == "3 things" and events[3].elapsed_s >= events[2].elapsed_s >= 0
    assert events[5].detail == "ValueError: no good"


def test_without_a_listener_nothing_is_told_and_a_broken_listener_breaks_nothing():
    seen = []
    with stage("alone", "nobody listens") as run:
        run.detail = "fine"
    assert seen == []

    def broken(event):
        seen.append(event)
        raise RuntimeError("listener bug")

    with reporting(broken):
        with stage("work", "working"):
            pass
    assert [e.state for e in seen] == ["start", "done"]
    # the listener belongs to the context it was installed in: gone after, absent in threads
    with stage("after", "after"):
        pass
    with reporting(seen.append):
        t = threading.Thread(target=lambda: stage("thread", "elsewhere").__enter__())
        t.start()
        t.join()
    assert [e.key for e in seen] == ["work", "work"]


def test_a_numba_compile_of_toast_lab_code_is_the_compile_stage(monkeypatch):
    numba = pytest.importorskip("numba")

    @numba.njit
    def kernel(x):
        return x + 1

    monkeypatch.setattr(progress, "COMPILED_MODULES", __name__)
    events = []
    with reporting(events.append):
        with stage("model", "building the model"):
            kernel(1)
        kernel(2)  # compiled already: nothing to say
    assert _states(events) == [("model", "start", 0), ("compile", "start", 1),
                               ("compile", "done", 1), ("model", "done", 0)]
    assert events[1].message == progress.COMPILE[1] and events[1].note == progress.COMPILE[2]

    @numba.njit
    def other(x):
        return x - 1

    monkeypatch.setattr(progress, "COMPILED_MODULES", "somebody_else.")
    events.clear()
    with reporting(events.append):
        other(1)  # not toast_lab's
    assert events == []


def test_a_numba_cache_hit_is_not_a_compile(tmp_path):
    """From numba's on-disk cache (every run after the first), no "compiling" is shown."""
    pytest.importorskip("numba")
    (tmp_path / "kern.py").write_text(textwrap.dedent("""
        from numba import njit

        @njit(cache=True)
        def f(x):
            return 2 * x
    """))
    script = textwrap.dedent("""
        from toast_lab import progress
        progress.COMPILED_MODULES = "kern"
        import kern
        events = []
        with progress.reporting(events.append):
            kern.f(3)
        print(sorted({e.key for e in events}))
    """)
    # (no kernel compiled ahead: its compile would hold numba's lock, and kern.f wait for it)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), TOAST_LAB_COMPILE_AHEAD="0",
               PYTHONPATH=os.pathsep.join([str(tmp_path)] + sys.path))
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=300, cwd=tmp_path) for _ in range(2)]
    assert [r.stdout.strip() for r in runs] == ["['compile']", "[]"], [r.stderr for r in runs]


def test_events_are_frozen():
    e = ProgressEvent("k", "m", "start")
    with pytest.raises(AttributeError):
        e.state = "done"
