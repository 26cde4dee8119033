"""The Lab's Bokeh charts: fed from the view model, composed with the widget, updated on every
change (the browser side is tests/e2e)."""

import pytest

import toast_lab as tl
from toast_lab.lab import Lab
from toast_lab.lab._charts import BAD, MAX_REFERENCES, LabCharts, MemoryChart

pytest.importorskip("jupyter_bokeh")


@pytest.fixture(scope="module")
def gpt():
    # GPT-2-small width, 2 layers, on 16 GiB devices: replicated does not fit, sharded does.
    fn, args = tl.zoo.get("gpt", size="gpt2-small", layers=2)
    an = tl.analyze(tl.trace(fn, *args))
    return an, tl.Mesh({"data": 4, "model": 2}, device="tpu-v5e")


class NullWidget:
    view = op_costs = None

    def on_event(self, callback):
        pass


@pytest.fixture
def lab(gpt):
    an, mesh = gpt  # on the replicated plan, which does not fit: the chart starts red
    return Lab.from_analysis(an, mesh, tl.Plan.replicated(an), widget=NullWidget())


def test_memory_bar_is_the_breakdown_against_capacity_and_red_when_over():
    gib = 2**30
    chart = MemoryChart({"params": 6 * gib, "temps": 4 * gib, "aliased": -1 * gib}, 16 * gib)
    assert chart.fits and chart.capacity.location == 16
    assert chart.source.data == {"y": ["memory"], "params": [6.0], "temps": [4.0]}
    assert "9.00 GiB of 16.0 GiB (1.00 GiB saved by donation)" in chart.fig.title.text
    chart.update({"params": 12 * gib, "temps": 8 * gib}, 16 * gib)
    assert not chart.fits and chart.capacity.line_color == BAD
    assert "does not fit" in chart.fig.title.text
    assert all(r.glyph.line_color == BAD for r in chart._renderers)
    chart.update({"params": 1 * gib, "temps": 1 * gib}, 16 * gib)
    assert chart.fits and chart.capacity.line_color != BAD


def test_charts_follow_the_view_model(lab):
    charts = lab.charts
    assert isinstance(charts, LabCharts) and lab.charts is charts
    # The expert strategies that fit, best first, as the progress chart's reference lines.
    fitting = sorted((e for e in lab.view.experts if e.feasible), key=lambda e: e.step_time_s)
    assert list(charts.references) == [e.name for e in fitting[:MAX_REFERENCES]]
    assert not charts.memory.fits  # replicated does not fit in 16 GiB
    before = dict(charts.memory.source.data)
    lab.pin("batch", "data")  # every pin: the memory bar moves with the estimate
    assert lab._settle_charts()
    est = lab.estimate
    bars = {k: v[0] for k, v in charts.memory.source.data.items() if k != "y"}
    assert bars != {k: v[0] for k, v in before.items() if k != "y"}
    assert sum(bars.values()) * 2**30 == pytest.approx(est.peak_memory_bytes, rel=1e-9)
    assert charts.memory.fits == est.feasible
    # A search: the progress chart holds its history, up to "now".
    lab.search(simulations=300, background=False)
    assert lab._settle_charts()
    s = lab.view.search
    data = charts.progress.source.data
    assert len(data["best_ms"]) >= len(s.history) >= 1
    assert data["best_ms"][-1] == pytest.approx(1e3 * s.best_step_time_s)
    assert data["sims"][-1] == s.simulations
    assert charts.progress.by_time.title.text.startswith("Best plan so far: ")


def test_the_lab_displays_its_widget_then_the_charts_under_it(gpt, monkeypatch):
    pytest.importorskip("ipywidgets")
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda w: shown.append(w))
    lab = Lab.from_analysis(*gpt)  # a real LabView
    bundle = lab._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert data["application/vnd.jupyter.widget-view+json"]["model_id"] == lab.widget.model_id
    assert data["text/plain"].startswith("Lab('gpt_train_step'")
    # After the cell (IPython's post_execute): the charts, up to date, and nothing else (the
    # JupyterLab extension loads BokehJS: no output embeds it).
    lab._show_charts()
    assert shown == [lab.charts.widget]
    assert "tl-charts" in lab.charts.widget._dom_classes
    lab.pin("batch", "data")
    assert lab._settle_charts()
    lab._show_charts()
    saved = lab.charts.memory.widget.render_bundle["docs_json"]
    assert f"{lab.estimate.peak_memory_bytes / 2**30:.2f} GiB of 16.0 GiB" in str(saved)


def test_charts_are_displayed_after_the_cell_that_shows_the_lab(gpt, monkeypatch):
    """In a kernel, showing the Lab registers a one-shot post_execute callback for the charts."""
    pytest.importorskip("ipywidgets")
    import IPython

    class Events:
        def __init__(self):
            self.callbacks = []

        def register(self, event, fn):
            self.callbacks.append((event, fn))

        def unregister(self, event, fn):
            self.callbacks.remove((event, fn))

    shell = type("Shell", (), {"events": Events()})()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    lab = Lab.from_analysis(*gpt)
    calls = []
    monkeypatch.setattr(lab, "_show_charts", lambda: calls.append(1))
    lab._repr_mimebundle_()
    ((event, callback),) = shell.events.callbacks
    assert event == "post_execute" and calls == []
    callback()
    assert calls == [1] and shell.events.callbacks == []


def test_a_chart_failure_shows_in_the_view_and_the_lab_goes_on(lab, monkeypatch):
    charts = lab.charts
    monkeypatch.setattr(charts, "update", lambda view: 1 / 0)
    lab.pin("batch", "data")
    assert lab._settle_charts()
    assert "the charts could not be updated: ZeroDivisionError" in lab.widget.view["error"]
    assert lab.plan.axes_of("batch") == ("data",)


def test_reference_lines_that_a_pin_rules_out_say_which_pin(lab):
    charts = lab.charts
    labels = lambda: {n: i.label.value for n, i in charts.progress.reference_items.items()}  # noqa: E731
    assert not any("ruled out" in text for text in labels().values())
    lab.pin("batch", "data")
    assert lab._settle_charts()
    rows = {e.name: e for e in lab.view.experts}
    for name, text in labels().items():
        pins = rows[name].ruled_out_by
        assert ("ruled out by batch=data" in text) == bool(pins), (name, text)
        span = next(s for s in charts.progress.by_time.center
                    if getattr(s, "name", "") == f"ref-{name}")
        assert span.line_alpha == (0.45 if pins else 1.0)  # faint (and dotted) when ruled out
    assert any(rows[n].ruled_out_by for n in charts.progress.reference_items)
    lab.unpin("batch")
    assert lab._settle_charts()
    assert not any("ruled out" in text for text in labels().values())
