"""The Lab's live charts: search progress and per-device memory, as Bokeh widgets.

Each chart is a small class with a `widget` (a `jupyter_bokeh.BokehModel`, an ipywidget) to put
in the Lab's layout and an `update(...)` that takes plain numbers; updating changes the Bokeh
document, which jupyter_bokeh sends to the page as a patch (so it works from the background
search thread too, without redrawing the widget).

BokehJS is not embedded in any output: toast-lab's JupyterLab extension loads it into the page
once (labextension/src/bokeh.ts), from the npm package `@bokeh/bokehjs` pinned to this `bokeh`'s
version (pyproject.toml pins `bokeh` to the same version; a test checks both), so a chart is
displayed like any widget and a saved notebook holds only the widget's reference:

    display(ipywidgets.HBox([progress.widget, memory.widget]))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bokeh.core.properties import value
from bokeh.layouts import row
from bokeh.models import (ColumnDataSource, Legend, LegendItem, NumeralTickFormatter,
                          Range1d, Span)
from bokeh.plotting import figure
from jupyter_bokeh import BokehModel

# Okabe–Ito: distinguishable with the common colour-vision deficiencies.
CATEGORY_COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
                   "#999999"]
BAD = "#C62828"
# Reference lines: Okabe–Ito without its yellow (too faint as a dashed line on white).
REFERENCE_COLORS = ["#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#999999"]
MAX_REFERENCES = 4


def _ms(seconds: float) -> float:
    return 1e3 * seconds


class SearchProgressChart:
    """Best step time found so far, against wall time and against simulations.

    `history` rows are the search's ``(t_s, simulations, best_step_time_s, peak_memory_bytes)``
    (SearchView.history). `references` are horizontal lines, e.g. the expert strategies' step
    times ``{"dp": 0.052}``, in seconds; their legend sits outside the plots, right.
    """

    def __init__(self, history: Sequence[Sequence[float]] = (),
                 references: Mapping[str, float] | None = None, width: int = 640,
                 height: int = 220, sizing_mode: str = "fixed") -> None:
        self.source = ColumnDataSource(data=self._columns(history), name="toast-lab-progress")
        self.y_range = Range1d(0, 1)
        legend_w = 130 if references else 0
        common = dict(height=height, toolbar_location=None, y_range=self.y_range,
                      background_fill_color="#fbfbfb", sizing_mode=sizing_mode)
        plot_w = (width - legend_w) // 2
        # Explicit x ranges: before any search there is no data to fit, and the simulations
        # axis reads "7k", not "7000" (tick labels run together at this width otherwise).
        self.t_range, self.sims_range = Range1d(0, 1), Range1d(0, 100)
        self.by_time = figure(x_axis_label="search time (s)", title="Best plan so far",
                              y_axis_label="best step time (ms)", width=plot_w,
                              x_range=self.t_range, **common)
        self.by_sims = figure(x_axis_label="simulations", title=" ", width=plot_w + legend_w,
                              x_range=self.sims_range, **common)
        self.by_sims.xaxis.formatter = NumeralTickFormatter(format="0.[0]a")
        for fig in (self.by_time, self.by_sims):
            fig.xaxis.ticker.desired_num_ticks = 4
        for fig, x in ((self.by_time, "t_s"), (self.by_sims, "sims")):
            fig.step(x, "best_ms", source=self.source, mode="after", line_width=2,
                     color=CATEGORY_COLORS[0])
            fig.scatter(x, "best_ms", source=self.source, size=4, color=CATEGORY_COLORS[0])
            fig.title.text_font_size = "11pt"
        self.references: dict[str, Span] = {}
        self.reference_items: dict[str, LegendItem] = {}
        self._steps = dict(references or {})
        items = []
        for i, (name, step_s) in enumerate((references or {}).items()):
            color = REFERENCE_COLORS[i % len(REFERENCE_COLORS)]
            for fig in (self.by_time, self.by_sims):
                span = Span(location=_ms(step_s), dimension="width", line_dash="dashed",
                            line_color=color, line_width=1.5, name=f"ref-{name}")
                fig.add_layout(span)
            # A legend entry for the line (Spans have none of their own): an invisible point.
            proxy = self.by_sims.line([0], [_ms(step_s)], line_dash="dashed", color=color,
                                      line_width=1.5, visible=False)
            items.append(LegendItem(label=f"{name} {_ms(step_s):.3g} ms", renderers=[proxy]))
            self.references[name] = span
            self.reference_items[name] = items[-1]
        if items:
            self.by_sims.add_layout(Legend(items=items, location="center_left",
                                           label_text_font_size="8.5pt", border_line_alpha=0,
                                           title="expert plans", title_text_font_size="8.5pt",
                                           glyph_width=18, spacing=0), "right")
        self.layout = row(self.by_time, self.by_sims, sizing_mode=sizing_mode)
        self.update(history)
        self.widget = BokehModel(self.layout)

    def rule_out(self, ruled: Mapping[str, Sequence[str]]) -> None:
        """Marks the reference lines that pins rule out ({expert: the pins, "batch=data"}):
        faint and dotted, the legend saying by which pins (a search under them cannot reach
        that plan, so its line may stay below the best found)."""
        for name, item in self.reference_items.items():
            pins = tuple(ruled.get(name, ()))
            label = f"{name} {_ms(self._steps[name]):.3g} ms"
            # a literal (a plain string set later would be read as a data field's name)
            item.label = value(f"{label}\nruled out by {', '.join(pins)}" if pins else label)
            for fig in (self.by_time, self.by_sims):
                for span in fig.center:
                    if isinstance(span, Span) and span.name == f"ref-{name}":
                        span.line_dash = "dotted" if pins else "dashed"
                        span.line_alpha = 0.45 if pins else 1.0

    @staticmethod
    def _columns(history: Sequence[Sequence[float]]) -> dict[str, list[float]]:
        return {"t_s": [float(h[0]) for h in history],
                "sims": [float(h[1]) for h in history],
                "best_ms": [_ms(float(h[2])) for h in history],
                "peak_gib": [float(h[3]) / 2**30 for h in history]}

    def update(self, history: Sequence[Sequence[float]]) -> None:
        """Redraws with the search's whole history so far (rows as in SearchView.history)."""
        columns = self._columns(history)
        self.source.data = columns
        best = columns["best_ms"]
        refs = [span.location for span in self.references.values()]
        self.t_range.end = max(columns["t_s"] + [0.0]) * 1.05 or 1.0
        self.sims_range.end = max(columns["sims"] + [0.0]) * 1.05 or 100.0
        self.by_time.title.text = (f"Best plan so far: {best[-1]:.3g} ms" if best
                                   else "No search yet")
        ys = best + refs
        if ys:
            lo = min(ys)
            # With references, the scale is theirs and the best's now: the replicated start
            # (often 10x slower) enters from above instead of flattening what matters.
            hi = max(refs + best[-1:]) if refs else max(ys)
            pad = max(0.08 * (hi - lo), 0.02 * hi, 1e-6)
            self.y_range.start, self.y_range.end = max(0.0, lo - pad), hi + pad


class MemoryChart:
    """Per-device memory by category as one stacked bar, with a capacity line; red when the
    plan does not fit. `breakdown` maps a category to bytes (the estimate's memory_breakdown,
    whose sum is the peak); `capacity` is bytes. A negative category (memory saved by aliasing
    donated buffers) has no bar of its own: the title says how much it saves."""

    def __init__(self, breakdown: Mapping[str, float], capacity: float, width: int = 640,
                 height: int = 190, sizing_mode: str = "fixed") -> None:
        self.fig = figure(height=height, width=width, toolbar_location=None, y_range=["memory"],
                          sizing_mode=sizing_mode,
                          x_range=Range1d(0, 1),
                          x_axis_label="GiB per device", title="Memory per device",
                          background_fill_color="#fbfbfb")
        self.fig.title.text_font_size = "11pt"
        self.fig.yaxis.visible = False
        self.source = ColumnDataSource(name="toast-lab-memory")
        self.capacity = Span(dimension="height", line_color="#222222", line_width=2.5,
                             name="capacity")
        self.fig.add_layout(self.capacity)
        self.fig.ygrid.visible = False
        # Below the bar, so the categories never hide it.
        # Two rows of two: four category names in one row are wider than the bar's plot.
        self.fig.add_layout(Legend(orientation="horizontal", label_text_font_size="9pt",
                                   border_line_alpha=0, click_policy="none", ncols=2),
                            "below")
        self._categories: tuple[str, ...] = ()
        self._renderers: list = []
        self.update(breakdown, capacity)
        # After the first update: the widget sends its document whole once, then only patches.
        self.widget = BokehModel(self.fig)

    def update(self, breakdown: Mapping[str, float], capacity: float) -> None:
        """Redraws the bar for `breakdown` (category → bytes) against `capacity` bytes."""
        gib = {k: float(v) / 2**30 for k, v in breakdown.items()}
        total = sum(gib.values())                     # the peak
        saved = -sum(v for v in gib.values() if v < 0)
        bars = {k: v for k, v in gib.items() if v > 0}  # nothing to draw for an empty one
        categories = tuple(bars)
        fits = total <= capacity / 2**30
        data = {"y": ["memory"], **{k: [v] for k, v in bars.items()}}
        if categories != self._categories:
            # New categories need new glyphs; the usual update only changes numbers.
            for r in self._renderers:
                self.fig.renderers.remove(r)
            if self.fig.legend:
                self.fig.legend[0].items = []
            self.source.data = data
            self._renderers = self.fig.hbar_stack(
                list(categories), y="y", height=0.6, source=self.source,
                color=[CATEGORY_COLORS[i % len(CATEGORY_COLORS)] for i in range(len(categories))],
                legend_label=list(categories), line_color="white", line_width=1)
            self._categories = categories
        elif data != self.source.data:
            self.source.data = data
        self.capacity.location = capacity / 2**30
        self.capacity.line_color = BAD if not fits else "#222222"
        for r in self._renderers:
            r.glyph.line_color = BAD if not fits else "white"
            r.glyph.line_width = 2 if not fits else 1
        self.fig.x_range.end = max(total + saved, capacity / 2**30) * 1.08
        self.fig.title.text = (f"Memory per device: {_gib(total)} of {_gib(capacity / 2**30)}"
                               + (f" ({_gib(saved)} saved by donation)" if saved > 0 else "")
                               + ("" if fits else " — does not fit"))
        self.fig.title.text_color = BAD if not fits else "#222222"
        self.fits = fits


def _gib(x: float) -> str:
    """GiB with the digits a person needs (a tiny model's peak is not "0.00 GiB")."""
    if x >= 10:
        return f"{x:.1f} GiB"
    if x >= 0.1:
        return f"{x:.2f} GiB"
    return f"{x * 1024:.1f} MiB" if x * 1024 >= 0.1 else f"{x * 2**20:.0f} KiB"


class LabCharts:
    """The Lab's live charts side by side: search progress (with the expert strategies as
    reference lines) and memory per device against capacity, both fed from the Lab's view
    model on every change (`update(view)`: a pin, a search's progress, its end).

    `widget` is an ipywidgets.HBox; call `rebundle()` before displaying it.
    """

    def __init__(self, view, width: int = 1060) -> None:
        import ipywidgets

        self.width = width
        est = view.estimate or {}
        self._last_history = self._history(view)
        self._ruled = _ruled_out(view)
        self.progress = self._progress_chart(view)
        self._last_memory = (dict(est.get("memory_breakdown", {})),
                             est.get("memory_capacity_bytes", 0.0))
        self.memory = MemoryChart(*self._last_memory, width=int(width * 0.42), height=220,
                                  sizing_mode="stretch_width")
        self.memory.widget.layout = ipywidgets.Layout(flex="1 1 340px", min_width="320px")
        self.dirty = False  # whether a chart changed since its widget's document was saved
        # The search's chart sits in a box of its own, so that replacing it (update) leaves
        # the row's children as they are: a new child list re-renders the memory chart's
        # view in the page beside a view of it not yet gone, and BokehJS indexes its root
        # views by model id.
        # Side by side when the card is wide enough for both to read, else one under the other
        # (a 1280 px screen with JupyterLab's side bar open): Bokeh draws on canvases, which
        # clip what does not fit them.
        self._progress_box = ipywidgets.Box(
            [self.progress.widget],
            layout=ipywidgets.Layout(flex="1.4 1 520px", min_width="420px"))
        self.widget = ipywidgets.HBox([self._progress_box, self.memory.widget],
                                      layout=ipywidgets.Layout(flex_flow="row wrap"))
        self.widget.add_class("tl-charts")  # drawn as the bottom of the Lab's card

    def _progress_chart(self, view) -> SearchProgressChart:
        """The search's chart, the expert plans of `view` its reference lines."""
        import ipywidgets

        self.references = _references(view)
        # Both stretch to the width the page gives them (the Lab's card is as wide as the
        # notebook), the progress chart taking the larger share.
        chart = SearchProgressChart(self._last_history, self.references,
                                    width=int(self.width * 0.56), sizing_mode="stretch_width")
        chart.widget.layout = ipywidgets.Layout(width="100%")  # the width of its box
        chart.rule_out(self._ruled)
        return chart

    def update(self, view) -> None:
        """Moves both charts to `view`; only what changed travels to the page."""
        if not self.references and _references(view):
            # the expert plans priced after the charts were made (a Lab whose prices were
            # pending): a new chart with their lines, in the old one's place. Only then:
            # later changes of the experts' prices (a step decision pinned) keep the lines
            # the search set out to beat
            self._last_history = self._history(view)
            self._ruled = _ruled_out(view)
            self.progress = self._progress_chart(view)
            self._progress_box.children = (self.progress.widget,)
            self.dirty = True
        ruled = _ruled_out(view)
        if ruled != self._ruled:
            self.progress.rule_out(ruled)
            self._ruled = ruled
            self.dirty = True
        history = self._history(view)
        if history != self._last_history:
            self.progress.update(history)
            self._last_history = history
            self.dirty = True
        est = view.estimate
        if est:
            memory = (dict(est.get("memory_breakdown", {})), est.get("memory_capacity_bytes", 0.0))
            if memory != self._last_memory:
                self.memory.update(*memory)
                self._last_memory = memory
                self.dirty = True

    def rebundle(self) -> None:
        """Makes each chart widget's saved document the current one, if anything changed since
        it was saved: a view displayed from now on starts from the current numbers (patches
        sent while no view existed are lost)."""
        if self.dirty:
            self.progress.widget.update_from_model(self.progress.layout)
            self.memory.widget.update_from_model(self.memory.fig)
            self.dirty = False

    @staticmethod
    def _history(view) -> tuple:
        """The search's improvements, and a last point at "now" so the line reaches the
        current time and simulation count (the best plan stays best until it improves)."""
        s = view.search
        rows = tuple(tuple(r) for r in s.history)
        if s.best_step_time_s is not None and rows and (
                s.elapsed_s > rows[-1][0] or s.simulations > rows[-1][1]):
            rows += ((s.elapsed_s, float(s.simulations), s.best_step_time_s, rows[-1][3]),)
        return rows


def _ruled_out(view) -> dict[str, tuple[str, ...]]:
    """{expert: the pins that rule it out} for the experts some pin rules out."""
    return {e.name: tuple(e.ruled_out_by) for e in view.experts if e.ruled_out_by}


def _references(view) -> dict[str, float]:
    """The expert strategies that fit in memory, the best MAX_REFERENCES first: the bars a
    search should beat (the Estimate tab lists them all)."""
    rows = sorted((e for e in view.experts if e.feasible), key=lambda e: e.step_time_s)
    return {e.name: e.step_time_s for e in rows[:MAX_REFERENCES]}
