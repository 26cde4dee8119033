"""The kernel compiled ahead, on a thread of its own from the first import
(toast_lab/cost/_kernel/_ahead.py): for the types every model's state has, waited for with
progress, and only where it is neither compiled, nor cached, nor turned off."""

import json
import os
import subprocess
import sys
import threading
import textwrap

import numba
import pytest

import toast_lab as tl
from toast_lab import progress
from toast_lab.cost._kernel import _ahead, _driver


def test_the_state_compiled_ahead_has_the_numba_type_of_every_models():
    tiny = numba.typeof(_ahead.tiny_state())
    fn, args = tl.zoo.get("gpt", size="tiny", layers=2)
    an = tl.analyze(tl.trace(fn, *args))
    model = tl.cost_model(an, tl.Mesh({"data": 4, "model": 2}, device="h100"))
    fn, args = tl.zoo.get("gpt_scan", layers=2, batch=16, seq=64)
    scan = tl.analyze(tl.trace(fn, *args))
    cpu = tl.cost_model(scan, tl.Mesh({"data": 2, "model": 4}, device="cpu"))
    plan = tl.strategies.expert(scan, cpu.mesh)["fsdp+tp"]
    step = cpu.for_step(plan.with_remat("block", "full").with_micro_batches(2).step).model
    states = [model.state, model.incremental()._state, cpu.state, step.state]
    assert all(numba.typeof(s) == tiny for s in states)
    model.estimate(tl.Plan.replicated(an))
    assert _driver.entry_types(model.state) in _driver._entry.signatures


def test_waiting_for_a_compile_under_way_is_the_compile_stage(monkeypatch):
    done = threading.Event()
    monkeypatch.setattr(_ahead, "_done", done)
    monkeypatch.setattr(_ahead, "_thread", threading.Thread(target=done.wait))
    threading.Timer(0.2, done.set).start()
    events = []
    with progress.reporting(events.append):
        _ahead.wait()
        _ahead.wait()  # done: nothing to wait for, nothing said
    assert [(e.key, e.state) for e in events] == [("compile", "start"), ("compile", "done")]
    assert events[1].elapsed_s >= 0.15 and events[0].message == progress.COMPILE[1]


def test_a_compile_begins_only_where_the_kernel_is_not_compiled_cached_or_turned_off(
        monkeypatch):
    began = []
    monkeypatch.setattr(_ahead, "_thread", None)
    monkeypatch.setattr(_ahead, "_done", threading.Event())
    monkeypatch.setattr(_ahead, "_compile", lambda: began.append(1) or _ahead._done.set())
    monkeypatch.setattr(_ahead, "cached", lambda: True)
    assert not _ahead.start()
    monkeypatch.setattr(_ahead, "cached", lambda: False)
    monkeypatch.setenv(_ahead.ENV, "0")
    assert not _ahead.start()
    monkeypatch.delenv(_ahead.ENV)
    assert _ahead.start() and not _ahead.start()  # (begun already)
    _ahead._thread.join()
    assert began == [1] and not _ahead.running()
    monkeypatch.undo()  # this process has the kernel compiled: a real start refuses
    assert _driver._entry.signatures and _ahead.cached() and not _ahead.start()


# a fresh interpreter: the compile under way from the import, the first estimate waiting for it
_FIRST_RUN = textwrap.dedent("""
    import json
    import toast_lab as tl
    from toast_lab import progress
    from toast_lab.cost._kernel import _ahead, _driver
    began = _ahead.running()
    fn, args = tl.zoo.get("gpt", size="tiny", layers=2)
    an = tl.analyze(tl.trace(fn, *args))
    events = []
    with progress.reporting(events.append):
        tl.estimate(an, tl.Plan.replicated(an), tl.Mesh({"data": 2}))
    print(json.dumps({"began": began, "events": [[e.key, e.state] for e in events],
                      "signatures": len(_driver._entry.signatures)}))
""")


@pytest.mark.slow
def test_from_empty_caches_the_first_estimate_waits_for_the_compile_begun_at_import(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    env.pop(_ahead.ENV, None)
    runs = [json.loads(subprocess.run([sys.executable, "-c", _FIRST_RUN], env=env, check=True,
                                      capture_output=True, text=True, timeout=1200)
                       .stdout.strip().splitlines()[-1]) for _ in range(2)]
    first, again = runs
    assert first == {"began": True, "signatures": 1,
                     "events": [["compile", "start"], ["compile", "done"]]}
    assert again == {"began": False, "signatures": 1, "events": []}  # from the cache
