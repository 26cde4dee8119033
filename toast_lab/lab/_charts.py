"""The Lab's live charts: search progress and per-device memory, as Bokeh widgets.

Each chart is a small class with a `widget` (a `jupyter_bokeh.BokehModel`, an ipywidget) to put
in the Lab's layout and an `update(...)` that takes plain numbers; updating changes the Bokeh
document, which jupyter_bokeh sends to the page as a patch (so it works from the background
search thread too, without redrawing the widget).

Offline: BokehJS is loaded inline, from this same `bokeh` package, never from a CDN, so the
Python and JavaScript halves are always the same version. `load_bokehjs()` must be displayed in
the page before a chart's widget is: call it each time the charts are displayed (the page may
have been reloaded while the kernel kept running, so "already loaded" is not the kernel's to
know), e.g.

    load_bokehjs()
    display(ipywidgets.VBox([lab_view, ipywidgets.HBox([progress.widget, memory.widget])]))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bokeh.io import output_notebook
from bokeh.layouts import row
from bokeh.models import ColumnDataSource, Legend, Range1d, Span
from bokeh.plotting import figure
from bokeh.resources import INLINE
from jupyter_bokeh import BokehModel

# Okabe–Ito: distinguishable with the common colour-vision deficiencies.
CATEGORY_COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
                   "#999999"]
BAD = "#C62828"


def load_bokehjs() -> None:
    """Displays BokehJS inline (no CDN), so that the Bokeh widgets displayed after it render.

    jupyter_bokeh's JupyterLab extension runs the `application/vnd.bokehjs_load.v0+json`
    output this makes; the page ignores a second load of the same BokehJS.
    """
    output_notebook(resources=INLINE, hide_banner=True)


def _ms(seconds: float) -> float:
    return 1e3 * seconds


class SearchProgressChart:
    """Best step time found so far, against wall time and against simulations.

    `history` rows are the search's ``(t_s, simulations, best_step_time_s, peak_memory_bytes)``
    (SearchView.history). `references` are horizontal lines, e.g. the expert strategies' step
    times ``{"dp": 0.052}``, in seconds.
    """

    def __init__(self, history: Sequence[Sequence[float]] = (),
                 references: Mapping[str, float] | None = None, width: int = 640,
                 height: int = 220) -> None:
        self.source = ColumnDataSource(data=self._columns(history), name="toast-lab-progress")
        self.y_range = Range1d(0, 1)
        common = dict(height=height, width=width // 2, toolbar_location=None, y_range=self.y_range,
                      y_axis_label="best step time (ms)", background_fill_color="#fbfbfb")
        self.by_time = figure(x_axis_label="search time (s)", title="Best plan so far", **common)
        self.by_sims = figure(x_axis_label="simulations", title=" ", **common)
        for fig, x in ((self.by_time, "t_s"), (self.by_sims, "sims")):
            fig.step(x, "best_ms", source=self.source, mode="after", line_width=2,
                     color=CATEGORY_COLORS[0])
            fig.scatter(x, "best_ms", source=self.source, size=4, color=CATEGORY_COLORS[0])
            fig.title.text_font_size = "11pt"
        self.references: dict[str, Span] = {}
        for i, (name, step_s) in enumerate((references or {}).items()):
            color = CATEGORY_COLORS[(i + 1) % len(CATEGORY_COLORS)]
            for fig in (self.by_time, self.by_sims):
                span = Span(location=_ms(step_s), dimension="width", line_dash="dashed",
                            line_color=color, line_width=1.5, name=f"ref-{name}")
                fig.add_layout(span)
            # A legend entry for the line (Spans have none of their own).
            self.by_sims.line([0], [_ms(step_s)], legend_label=name, line_dash="dashed",
                              color=color, line_width=1.5)
            self.references[name] = span
        if references:
            self.by_sims.legend.location = "top_right"
            self.by_sims.legend.label_text_font_size = "9pt"
        self.layout = row(self.by_time, self.by_sims)
        self.update(history)
        self.widget = BokehModel(self.layout)

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
        ys = columns["best_ms"] + [span.location for span in self.references.values()]
        if ys:
            lo, hi = min(ys), max(ys)
            pad = max(0.06 * (hi - lo), 0.02 * hi, 1e-6)
            self.y_range.start, self.y_range.end = lo - pad, hi + pad


class MemoryChart:
    """Per-device memory by category as one stacked bar, with a capacity line; red when the
    plan does not fit. `breakdown` maps a category to bytes; `capacity` is bytes."""

    def __init__(self, breakdown: Mapping[str, float], capacity: float, width: int = 640,
                 height: int = 190) -> None:
        self.fig = figure(height=height, width=width, toolbar_location=None, y_range=["memory"],
                          x_range=Range1d(0, 1),
                          x_axis_label="GiB per device", title="Memory per device",
                          background_fill_color="#fbfbfb")
        self.fig.title.text_font_size = "11pt"
        self.source = ColumnDataSource(name="toast-lab-memory")
        self.capacity = Span(dimension="height", line_color="#222222", line_width=2.5,
                             name="capacity")
        self.fig.add_layout(self.capacity)
        self.fig.ygrid.visible = False
        # Below the bar, so the categories never hide it.
        self.fig.add_layout(Legend(orientation="horizontal", label_text_font_size="9pt",
                                   border_line_alpha=0), "below")
        self._categories: tuple[str, ...] = ()
        self._renderers: list = []
        self.update(breakdown, capacity)
        # After the first update: the widget sends its document whole once, then only patches.
        self.widget = BokehModel(self.fig)

    def update(self, breakdown: Mapping[str, float], capacity: float) -> None:
        """Redraws the bar for `breakdown` (category → bytes) against `capacity` bytes."""
        categories = tuple(breakdown)
        gib = {k: float(v) / 2**30 for k, v in breakdown.items()}
        total = sum(gib.values())
        fits = total <= capacity / 2**30
        if categories != self._categories:
            # New categories need new glyphs; the usual update only changes numbers.
            for r in self._renderers:
                self.fig.renderers.remove(r)
            if self.fig.legend:
                self.fig.legend[0].items = []
            self.source.data = {"y": ["memory"], **{k: [v] for k, v in gib.items()}}
            self._renderers = self.fig.hbar_stack(
                list(categories), y="y", height=0.6, source=self.source,
                color=[CATEGORY_COLORS[i % len(CATEGORY_COLORS)] for i in range(len(categories))],
                legend_label=list(categories), line_color="white", line_width=1)
            self._categories = categories
        else:
            self.source.data = {"y": ["memory"], **{k: [v] for k, v in gib.items()}}
        self.capacity.location = capacity / 2**30
        self.capacity.line_color = BAD if not fits else "#222222"
        for r in self._renderers:
            r.glyph.line_color = BAD if not fits else "white"
            r.glyph.line_width = 2 if not fits else 1
        self.fig.x_range.end = max(total, capacity / 2**30) * 1.08
        self.fig.title.text = (f"Memory per device: {total:.2f} of {capacity / 2**30:.1f} GiB"
                               + ("" if fits else " — does not fit"))
        self.fig.title.text_color = BAD if not fits else "#222222"
        self.fits = fits
