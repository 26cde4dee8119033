"""What the cell shows while `tl.Lab(...)` builds: its stages as they start and finish.

`CellProgress` is a progress listener (toast_lab.progress) that draws the stages in the running
cell's output: one display, made at once and updated in place (text/html, and text/plain for
any front end without HTML), a line per stage with its seconds, ticking while a stage runs. It
needs IPython only, not ipywidgets. When the Lab is built it ends as one line of totals.
"""

from __future__ import annotations

import contextlib
import html
import logging
import threading
import time
from dataclasses import dataclass, field

from ..progress import ProgressEvent, reporting

log = logging.getLogger("toast_lab.lab")

TICK_S = 1.0  # how often a running stage's seconds are redrawn
_MARK = {"start": "⋯", "done": "✓", "failed": "✗"}


def _seconds(s: float) -> str:
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    return f"{int(s // 60)} min {int(s % 60):02d} s"


@dataclass
class _Line:
    event: ProgressEvent
    started: float = field(default_factory=time.perf_counter)

    @property
    def running(self) -> bool:
        return self.event.state == "start"

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started if self.running else self.event.elapsed_s


class CellProgress:
    """The stages of building a Lab in the running cell (see the module docstring).

    title: the first line ("building the Lab on ..."). display: IPython.display.display, or a
    stand-in with the same signature (tests); it must return a handle with `update`.
    """

    def __init__(self, title: str, display=None, tick_s: float = TICK_S) -> None:
        if display is None:
            from IPython.display import display
        self.title = title
        self.lines: list[_Line] = []
        self.summary: str | None = None
        self.failed = False
        self._lock = threading.Lock()
        self._handle = display(self._bundle(), raw=True, display_id=True)
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, args=(tick_s,), daemon=True,
                                        name="toast-lab progress")
        self._ticker.start()

    def __call__(self, event: ProgressEvent) -> None:
        with self._lock:
            if event.state == "start":
                self.lines.append(_Line(event))
            else:
                self.failed |= event.state == "failed"
                for line in reversed(self.lines):
                    if line.running and line.event.key == event.key:
                        line.event = event
                        break
                else:
                    self.lines.append(_Line(event))
        self._draw()

    def close(self, total_s: float, built: bool = True) -> None:
        """Stops ticking; a Lab built (`built`) without a failed stage ends as one line of
        totals, else the stages stay as they are, marked failed."""
        self._stop.set()
        self.failed |= not built
        if not self.failed:
            top = [ln.event for ln in self.lines if ln.event.depth == 0]
            compiled = [ln.event for ln in self.lines if ln.event.key == "compile"]
            parts = [f"{e.key} {_seconds(e.elapsed_s)}" for e in top]
            note = (f"; compiled the cost model in {_seconds(sum(e.elapsed_s for e in compiled))}"
                    f" (cached for the next runs)" if compiled else "")
            # a first view drawn before the kernel's compile ends says its prices follow
            note += "".join(f"; {e.detail}, the Lab fills them in" for e in top
                            if e.detail.startswith("prices pending"))
            self.summary = f"Lab built in {_seconds(total_s)}: {' · '.join(parts)}{note}"
        self._draw()

    def _tick(self, tick_s: float) -> None:
        while not self._stop.wait(tick_s):
            with self._lock:
                slow = any(ln.running and ln.elapsed_s() >= tick_s for ln in self.lines)
            if slow:
                self._draw()

    def _draw(self) -> None:
        with self._lock:
            bundle = self._bundle()
        try:
            self._handle.update(bundle, raw=True)
        except Exception:  # noqa: BLE001 - a closed front end: the Lab is built all the same
            pass

    def _rows(self) -> list[tuple[int, str, str, str]]:
        """(depth, mark, text, state) per line, as drawn."""
        rows = []
        for ln in self.lines:
            e = ln.event
            text = f"{e.message}  {_seconds(ln.elapsed_s())}"
            if e.note and ln.running:
                text += f"  ({e.note})"
            if e.detail:
                text += f" · {e.detail}"
            rows.append((e.depth, _MARK[e.state], text, e.state))
        return rows

    def _bundle(self) -> dict:
        state = "failed" if self.failed else "done" if self.summary else "running"
        if self.summary is not None:
            plain = f"toast-lab · {self.summary}"
            body = (f'<div data-toast-lab-progress="done" style="{_STYLE}color:'
                    f'var(--jp-ui-font-color2,#666)">toast-lab · {html.escape(self.summary)}</div>')
            return {"text/plain": plain, "text/html": body}
        rows = self._rows()
        plain = "\n".join([f"toast-lab · {self.title}"]
                          + [f"{'  ' * (d + 1)}{m} {t}" for d, m, t, _ in rows])
        items = "".join(
            f'<div data-stage-state="{s}" style="padding-left:{1.2 * (d + 1):.1f}em;'
            f'{_COLOR[s]}">{m} {html.escape(t)}</div>' for d, m, t, s in rows)
        body = (f'<div data-toast-lab-progress="{state}" style="{_STYLE}">'
                f'<div style="font-weight:600">toast-lab · {html.escape(self.title)}</div>'
                f'{items}</div>')
        return {"text/plain": plain, "text/html": body}


_STYLE = ("font-family:var(--jp-ui-font-family,sans-serif);font-size:12.5px;line-height:1.55;"
          "white-space:pre-wrap;")
_COLOR = {"start": "", "done": "color:var(--jp-ui-font-color2,#666);",
          "failed": "color:var(--jp-error-color1,#c62828);"}


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (where the Lab will be displayed)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


@contextlib.contextmanager
def building(progress, title: str):
    """Reports the stages run inside to `progress`: a callable (toast_lab.progress listener),
    False (nobody), or None: the running cell's output in a Jupyter kernel (CellProgress),
    else nobody. The cell's display ends as one line of totals."""
    cell = None
    if progress is None and in_kernel():
        try:
            progress = cell = CellProgress(title)
        except Exception:  # noqa: BLE001 - no display: build without showing progress
            log.exception("toast-lab: could not show the Lab's progress")
            progress = None
    started = time.perf_counter()
    built = False
    try:
        with reporting(progress or None):
            yield
        built = True
    finally:
        if cell is not None:
            cell.close(time.perf_counter() - started, built)
