"""The Lab's session (no UI): pins with reasons, estimates, background search, export."""

import json
import threading
import time

import pytest

import toast_lab as tl
from toast_lab.lab import PinError, Session


@pytest.fixture(scope="module")
def gpt():
    fn, args = tl.zoo.get("gpt", size="tiny", layers=3)
    an = tl.analyze(tl.trace(fn, *args))
    return an, tl.Mesh({"data": 4, "model": 2}, device="h100")


@pytest.fixture
def session(gpt):
    """A session on the replicated plan: each test pins from nothing."""
    an, mesh = gpt
    return Session(an, mesh, tl.Plan.replicated(an))


def test_pin_gives_the_estimate_of_the_new_plan(session, gpt):
    an, mesh = gpt
    before = session.estimate
    plan = session.pin("batch", ("data",))
    assert plan.axes_of("batch") == ("data",) and "batch" in plan.pinned
    assert session.plan is plan and session.pins == {"batch": ("data",)}
    assert session.estimate == tl.estimate(an, plan, mesh)
    assert session.estimate.step_time_s != before.step_time_s
    assert session.error is None
    session.pin("mlp", "model")  # a single axis may be given as a name
    assert session.plan.axes_of("mlp") == ("model",)
    assert session.plan.axes_of("batch") == ("data",)


def test_empty_axes_pin_a_class_replicated(session):
    session.pin("batch", ("data",))
    plan = session.pin("batch", ())
    assert plan.axes_of("batch") == () and "batch" in plan.pinned
    assert session.pins == {"batch": ()}


@pytest.mark.parametrize("name, value, words", [
    ("heads", ("data", "model"), ["heads", "size 4", "not divisible", "8 devices"]),
    ("batch", ("data", "data"), ["twice"]),
    ("batch", ("rows",), ["no axis 'rows'", "data", "model"]),
    ("bacth", ("data",), ["no class or conflict named 'bacth'"]),
    ("batch", 3, ["mesh axes"]),
])
def test_an_impossible_pin_is_refused_with_the_reason(session, name, value, words):
    before = session.plan
    with pytest.raises(PinError) as err:
        session.pin(name, value)
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    assert session.error == str(err.value)
    assert session.plan is before  # nothing changed
    session.pin("batch", "data")  # a good action clears the error
    assert session.error is None


def test_conflict_pins_and_contradictions(session, gpt):
    an, _ = gpt
    conflict = an.conflicts[0]
    cls = an.classes[conflict.class_id].name
    with pytest.raises(PinError, match="no resolution 'keep_both'"):
        session.pin(conflict.name, "keep_both")
    session.pin(cls, ("data",))
    plan = session.pin(conflict.name, conflict.resolutions[1])
    assert plan.resolution_of(conflict.id) == conflict.resolutions[1]
    assert conflict.name in plan.pinned
    with pytest.raises(PinError, match="contradictory pins"):
        session.pin(cls, ())
    session.unpin(conflict.name)
    session.pin(cls, ())
    with pytest.raises(PinError, match="contradictory pins"):
        session.pin(conflict.name, conflict.resolutions[0])


def test_first_decision_wins_is_allowed_and_explained(session, gpt):
    an, _ = gpt
    session.pin("batch", ("data",))
    # embed shares tensors with batch (activations [batch, seq, embed])
    session.pin("embed", ("data",))
    assert session.error is None
    assert "batch (decided first) keeps data" in session.notice
    assert "embed is not sharded over data there" in session.notice


def test_unpin_keeps_the_value_and_releases_the_decision(session):
    session.pin("batch", ("data",))
    plan = session.unpin("batch")
    assert plan.axes_of("batch") == ("data",) and "batch" not in plan.pinned
    with pytest.raises(PinError, match="not pinned"):
        session.unpin("batch")


def test_a_per_domain_override_is_pinned_and_unpinned_by_its_name(session):
    # "<class>@<domain>", as tl.search's pins and plan files name it (ZeRO-1: the optimizer
    # state's embed over data); a plan with one pinned could not be released before
    session.pin("batch", ("data",))
    plan = session.pin("embed@optimizer", ("data",))
    assert plan.axes_of("embed", "optimizer") == ("data",) and plan.axes_of("embed") == ()
    assert session.pins["embed@optimizer"] == ("data",)
    assert session.estimate == tl.estimate(session.analysis, plan, session.mesh)
    plan = session.unpin("embed@optimizer")
    assert "embed@optimizer" not in plan.pinned and plan.axes_of("embed", "optimizer") == ("data",)
    with pytest.raises(PinError, match="not pinned"):
        session.unpin("embed@optimizer")
    with pytest.raises(PinError, match="no class or conflict named 'bogus'"):
        session.pin("bogus@optimizer", "data")


def test_history_records_each_change(session):
    session.pin("batch", ("data",))
    session.unpin("batch")
    actions = [(c.action, c.name) for c in session.history]
    assert actions == [("start", None), ("pin", "batch"), ("unpin", "batch")]
    assert session.history[1].value == ("data",)


def test_export_writes_a_plan_file_that_loads_as_the_same_plan(session, gpt, tmp_path):
    an, _ = gpt
    session.pin("batch", ("data",))
    session.pin("mlp", ("model",))
    path = session.export(tmp_path / "plan.json", extra={"view": {"format": "toast-lab-view"}})
    loaded = tl.Plan.load(path, an)
    assert loaded == session.plan and loaded.pinned == session.plan.pinned
    doc = json.loads(path.read_text())
    assert doc["estimate"]["step_time_s"] == pytest.approx(session.estimate.step_time_s)
    assert doc["view"] == {"format": "toast-lab-view"}


def test_foreground_search_keeps_pins_and_is_reproducible(gpt):
    an, mesh = gpt
    results = []
    for _ in range(2):
        s = Session(an, mesh)
        s.pin("batch", ("data",))
        res = s.search(budget_s=None, simulations=300, background=False, seed=3)
        assert res.plan.axes_of("batch") == ("data",) and "batch" in res.plan.pinned
        assert s.plan == res.plan
        assert s.estimate.step_time_s == pytest.approx(res.estimate.step_time_s)
        start = tl.Plan.replicated(an).with_axes("batch", "data")  # warm start: never worse
        assert s.estimate.step_time_s <= tl.estimate(an, start, mesh).step_time_s
        assert not s.search_state.running and s.search_state.simulations == res.simulations
        results.append(res.plan)
    assert results[0] == results[1]


def test_background_search_publishes_to_listeners_and_stops_from_another_thread(gpt):
    an, mesh = gpt
    s = Session(an, mesh, progress_every_s=0.01)
    heard = []
    s.add_listener(lambda change: heard.append((change, threading.current_thread().name)))
    fut = s.search(budget_s=60)
    deadline = time.monotonic() + 30
    while s.search_state.simulations == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.running and s.search_state.running
    stopper = threading.Thread(target=s.stop)
    stopper.start()
    stopper.join(30)
    res = fut.result(30)
    assert not s.running and not s.search_state.running
    assert s.plan == res.plan and res.simulations > 0
    assert s.search_state.history and s.search_state.message == res.message
    assert any(thread == "toast-lab search" for _, thread in heard)
    assert heard[-1][0] == "plan"


def test_a_second_search_is_refused_while_one_runs(gpt):
    an, mesh = gpt
    s = Session(an, mesh)
    s.search(budget_s=60)
    try:
        with pytest.raises(RuntimeError, match="already running"):
            s.search(budget_s=1)
        assert "already running" in s.error
    finally:
        s.stop()


def test_pinning_during_a_search_stops_it_first(gpt):
    an, mesh = gpt
    s = Session(an, mesh)
    fut = s.search(budget_s=60)
    s.pin("batch", ("data",))
    assert fut.done() and not s.running
    assert s.plan.axes_of("batch") == ("data",) and "batch" in s.plan.pinned
    assert "stopped" in s.notice


def test_a_failing_listener_does_not_break_the_session(session):
    def broken(change):
        raise RuntimeError("display bug")
    session.add_listener(broken)
    session.pin("batch", ("data",))
    assert session.plan.axes_of("batch") == ("data",)


def test_selection(session, gpt):
    an, _ = gpt
    assert session.select("op", 5).id == "5"
    assert session.select("class", "batch").id == str(an.class_named("batch").id)
    with pytest.raises(ValueError, match="no op"):
        session.select("op", 10**9)
    with pytest.raises(ValueError, match="cannot select"):
        session.select("planet", 1)
    assert session.select(None) is None


@pytest.mark.slow
def test_stop_from_another_thread_ends_the_search_within_0_2_s(gpt):
    an, mesh = gpt
    s = Session(an, mesh)
    s.add_listener(lambda change: None)
    fut = s.search(budget_s=60)
    time.sleep(0.5)
    t0 = time.perf_counter()
    stopper = threading.Thread(target=s.stop)
    stopper.start()
    stopper.join()
    elapsed = time.perf_counter() - t0
    assert fut.done() and elapsed < 0.2, elapsed
    assert s.plan == fut.result().plan


# --- the first plan ---------------------------------------------------------------------------

def _fastest_fitting(an, mesh, pins=None):
    rows = []
    for name, plan in tl.strategies.expert(an, mesh).items():
        if pins and any(plan.axes_of(k) != v for k, v in pins.items()):
            continue
        est = tl.estimate(an, plan, mesh)
        if est.feasible:
            rows.append((est.step_time_s, name, plan))
    return min(rows, key=lambda r: (r[0], r[1]))


def test_a_session_starts_on_the_fastest_expert_plan_that_fits(gpt):
    an, mesh = gpt
    s = Session(an, mesh)
    step, name, plan = _fastest_fitting(an, mesh)
    assert s.start.name == name and s.start.how == "expert"
    assert s.plan == plan and not s.plan.pinned
    assert s.estimate == tl.estimate(an, plan, mesh)
    assert s.start.step_time_s == pytest.approx(step)
    assert s.start.label.startswith(f"start: {name}, ") and s.start.label.endswith(" ms")
    assert "fastest" in s.start.note
    assert s.history[0].action == "start" and s.history[0].plan == plan


def test_pins_given_at_the_start_are_kept_and_choose_among_the_experts_they_allow(gpt):
    an, mesh = gpt
    s = Session(an, mesh, pins={"batch": "data"})
    step, name, plan = _fastest_fitting(an, mesh, {"batch": ("data",)})
    assert s.start.name == name and "under your pins" in s.start.note
    assert s.plan.axes_of("batch") == ("data",) and s.pins == {"batch": ("data",)}
    assert s.plan.class_axes == plan.class_axes
    # the experts it rules out (batch over data×model) are not the start
    assert tl.strategies.expert(an, mesh)[name].axes_of("batch") == ("data",)
    with pytest.raises(PinError, match="no class or conflict named 'bacth'"):
        Session(an, mesh, pins={"bacth": "data"})


def test_a_given_plan_is_the_start_with_the_pins_on_top(gpt):
    an, mesh = gpt
    plan = tl.Plan.replicated(an).with_axes("mlp", "model")
    s = Session(an, mesh, plan, pins={"batch": "data"})
    assert s.start.name == "your plan" and s.start.how == "given"
    assert s.plan.axes_of("mlp") == ("model",) and s.plan.axes_of("batch") == ("data",)
    assert s.pins == {"batch": ("data",)}


def test_where_no_strategy_fits_as_written_one_with_its_recipes_remat_starts(gpt):
    an, mesh = gpt
    written = {n: tl.estimate(an, p, mesh).peak_memory_bytes
               for n, p in tl.strategies.expert(an, mesh, fit=False).items()}
    cap = min(written.values()) * 0.999
    s = Session(an, mesh, memory_cap=cap)
    variants = tl.strategies.expert(an, mesh, memory_cap=cap).variant_of
    assert s.start.how == "expert" and s.start.name in variants, s.start
    assert s.estimate.peak_memory_bytes <= cap and not s.plan.step.is_default
    assert s.start.label.startswith(f"start: {s.start.name}, ")


def test_where_no_expert_plan_fits_a_short_search_or_the_smallest_one_starts(gpt):
    an, mesh = gpt
    # under a cap nothing fits, each strategy's variant is its ladder's smallest peak
    peaks = {n: tl.estimate(an, p, mesh).peak_memory_bytes
             for n, p in tl.strategies.expert(an, mesh, memory_cap=1.0).items()}
    cap = min(peaks.values()) * 0.999  # no expert plan fits, even with its recipe's remat
    s = Session(an, mesh, memory_cap=cap)
    assert s.start.how in ("search", "smallest")
    if s.start.how == "search":
        assert s.estimate.peak_memory_bytes <= cap and "search" in s.start.note
    s = Session(an, mesh, memory_cap=1.0)  # nothing fits: the smallest peak, said so
    assert s.start.how == "smallest" and "no plan found fits" in s.start.note
    assert s.start.name == min(peaks, key=lambda n: (peaks[n], n))
