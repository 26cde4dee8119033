"""The Lab's live charts (LabCharts), made and fed off the view's critical path.

The charts are made in a thread of their own when the Lab is built in a kernel (importing Bokeh
and building the figures takes a second or more), fed each new view in another (each chart
property set is a Bokeh document patch, ~2 ms: a pin's view reaches the page without waiting
for them), and displayed under the widget once the cell that shows the Lab has run.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("toast_lab.lab")


class ChartFeed:
    """The charts of one Lab (`lab`: its `_view`, `_refresh_lock`, `_show_error`,
    `_building_line` and `_show_charts`). `charts` is None until made."""

    def __init__(self, lab) -> None:
        self.lab = lab
        self.charts = None                 # LabCharts, made for the first display
        self.lock = threading.RLock()      # making, updating, saving the charts
        self._mutex = threading.Lock()     # the next view for the charts
        self._next = None
        self._busy = False
        self._idle = threading.Event()
        self._idle.set()

    def make(self):
        """The charts, made now if they are not yet, brought up to the view of the moment;
        None where Bokeh or jupyter_bokeh is missing."""
        lab = self.lab
        with self.lock:
            if self.charts is not None or lab._view is None:
                return self.charts
            try:
                from ._charts import LabCharts
            except ImportError as err:
                log.info("toast-lab: no charts (%s)", err)
                return None
            view = lab._view
            charts = LabCharts(view)
            with lab._refresh_lock:  # from now on every refresh reaches the charts
                self.charts = charts
                if lab._view is not view:
                    self.update_later(lab._view)
        return self.charts

    def prepare(self) -> None:
        """Makes the charts in a background thread, so that displaying the Lab (usually the
        next thing a notebook does) finds them ready; the widget's progress line says so."""
        self.lab._building_line("preparing the charts")
        threading.Thread(target=self._prepare, name="toast-lab charts", daemon=True).start()

    def _prepare(self) -> None:
        try:
            self.make()
        except Exception:  # noqa: BLE001 - displaying will try again and say what broke
            log.exception("toast-lab: the charts could not be made")
        finally:
            self.lab._building_line("")

    def update_later(self, vm) -> None:
        """Moves the charts to `vm` in a thread of their own; views that arrive while the
        charts update (a search) collapse into the newest."""
        with self._mutex:
            self._next = vm
            if self._busy:
                return
            self._busy = True
            self._idle.clear()
        threading.Thread(target=self._update, name="toast-lab charts update",
                         daemon=True).start()

    def _update(self) -> None:
        while True:
            with self._mutex:
                vm, self._next = self._next, None
                if vm is None:
                    self._busy = False
                    self._idle.set()
                    return
            try:
                with self.lock:
                    self.charts.update(vm)
            except Exception as err:  # noqa: BLE001 - a chart must not stop the Lab
                log.exception("toast-lab: the charts could not be updated")
                self.lab._show_error(f"the charts could not be updated: {type(err).__name__}: "
                                     f"{err}")

    def settle(self, timeout: float = 10.0) -> bool:
        """Waits until the charts show the latest view (tests, benchmarks)."""
        return self._idle.wait(timeout)

    def show(self) -> None:
        """Displays the charts (their saved documents brought up to date, so that this display
        starts from the current numbers and follows every later change). BokehJS is in the
        page already: the JupyterLab extension loads it."""
        charts = self.make()
        if charts is None:
            return
        from IPython.display import display

        with self.lock:
            charts.rebundle()
        display(charts.widget)

    def show_after_the_cell(self) -> None:
        """The charts go under the widget once the cell has run (the Lab's `_show_charts`, in
        IPython's post_execute): the graph, shown first, is not kept waiting for them."""
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None:
            return

        def once(*_args):
            shell.events.unregister("post_execute", once)
            try:
                self.lab._show_charts()
            except Exception:  # noqa: BLE001 - the Lab itself is on the page already
                log.exception("toast-lab: the charts could not be displayed")

        shell.events.register("post_execute", once)
