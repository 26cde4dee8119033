"""The Lab's notebook widget: synced state and front-end events, no engine logic.

`LabView` mirrors the TypeScript model `LabViewModel` / view `LabView` in the JupyterLab
extension "toast-lab" (labextension/src/widget.ts). Its three traitlets:

- `view`: the view model (_viewmodel.py), a JSON-ready dict (``format: "toast-lab-view"``),
  replaced whole on every change;
- `op_costs`: bytes, little-endian float64 ``[compute_s, comm_s]`` per op in op id order (a
  binary buffer, so a large program's per-op costs do not travel as JSON);
- `progress`: what the Lab is still doing once displayed ("preparing the charts"), drawn as a
  line over the view; "" when nothing.

The front end sends events as custom messages ``{"event": name, ...}``, one of `EVENTS`
(_viewmodel.py's docstring says what each carries and does). `on_event` delivers each as a
dict; the session decides what it means and answers by assigning a new `view`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import ipywidgets
import numpy as np
import traitlets

EVENTS = ("pin", "unpin", "toggle", "select", "search", "stop", "export")
MODULE_NAME = "toast-lab"


def _package_version() -> str:
    """The version the front end registered under: the built extension's, else the package's.

    The bundle's package.json is the truth the browser sees (a source checkout may be newer
    than the installed metadata); both come from the same release, which a test checks.
    """
    built = Path(__file__).resolve().parents[1] / "labextension" / "package.json"
    try:
        return json.loads(built.read_text())["version"]
    except (OSError, ValueError, KeyError):
        pass
    try:
        return metadata.version("toast-lab")
    except metadata.PackageNotFoundError:
        return "0.0.0"


MODULE_VERSION = _package_version()


def _bytes_to_json(value: bytes | None, widget: Any) -> memoryview | None:
    return None if value is None else memoryview(value)


def op_costs_bytes(compute_s: Sequence[float], comm_s: Sequence[float]) -> bytes:
    """Per-op costs in seconds as the `op_costs` buffer: float64 LE, [compute, comm] per op."""
    a = np.empty((len(compute_s), 2), dtype="<f8")
    a[:, 0] = compute_s
    a[:, 1] = comm_s
    return a.tobytes()


class LabView(ipywidgets.DOMWidget):
    """The Lab's view in a notebook; see the module docstring for the traitlets and events."""

    _model_name = traitlets.Unicode("LabViewModel").tag(sync=True)
    _model_module = traitlets.Unicode(MODULE_NAME).tag(sync=True)
    _model_module_version = traitlets.Unicode(f"^{MODULE_VERSION}").tag(sync=True)
    _view_name = traitlets.Unicode("LabView").tag(sync=True)
    _view_module = traitlets.Unicode(MODULE_NAME).tag(sync=True)
    _view_module_version = traitlets.Unicode(f"^{MODULE_VERSION}").tag(sync=True)

    view = traitlets.Dict().tag(sync=True)
    op_costs = traitlets.Bytes(None, allow_none=True).tag(sync=True, to_json=_bytes_to_json)
    progress = traitlets.Unicode("").tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._event_callbacks: list[Callable[[dict[str, Any]], Any]] = []
        self.on_msg(self._deliver)

    def on_event(self, callback: Callable[[dict[str, Any]], Any], remove: bool = False) -> None:
        """Calls `callback(event)` for each front-end event, e.g. ``{"event": "pin", ...}``.

        Callbacks run in the kernel's message handler, in registration order. One that raises
        does not stop the others; its traceback goes to the kernel's log. A session should
        catch its own errors and show them in the view's `error`.
        """
        if remove:
            self._event_callbacks.remove(callback)
        else:
            self._event_callbacks.append(callback)

    def _deliver(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict) or content.get("event") not in EVENTS:
            return  # not one of ours (another library's message, or a newer front end)
        event = dict(content)
        for callback in list(self._event_callbacks):
            try:
                callback(event)
            except Exception:  # the others still run; the kernel's log says what broke
                self.log.exception("toast-lab: an on_event callback failed on %r", event)
