"""Notebooks in the browser under test: write one, open it, run its cells, talk to its kernel.

Shared by the browser tests and benchmarks/lab_latency.py. `page` is a Playwright page on a
JupyterLab started by conftest.start_lab_server (which exposes `window.jupyterapp`).
"""

from __future__ import annotations

import json
from pathlib import Path

# The notebook panel in front, its kernel, and a code runner that collects what it prints.
_KERNEL = "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
_EXECUTE = '''async code => {
  const kernel = %s;
  const out = [];
  const future = kernel.requestExecute({code, store_history: false});
  future.onIOPub = msg => {
    if (msg.header.msg_type === "stream") { out.push(msg.content.text); }
  };
  const reply = await future.done;
  if (reply.content.status !== "ok") {
    throw new Error(reply.content.ename + ": " + reply.content.evalue);
  }
  return out.join("");
}''' % _KERNEL


def notebook(cells: list[str]) -> dict:
    """An nbformat-4 notebook of code cells, for the Python 3 kernel."""
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}},
            "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None,
                       "source": src, "outputs": []} for i, src in enumerate(cells)]}


def watched_page(browser_context, width: int, height: int, console_words=()):
    """A new page of `width` x `height` whose uncaught errors, and console errors naming one
    of `console_words` (lower case), collect in `page.errors`."""
    page = browser_context.new_page()
    page.set_viewport_size({"width": width, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    if console_words:
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and any(
            w in m.text.lower() for w in console_words) else None)
    page.errors = errors
    return page


def open_notebook(server, page, name: str, cells: list[str] | None = None,
                  run: bool = True) -> None:
    """Writes `cells` as notebook `name` in the server's root (unless None: it exists), opens
    it, waits for its kernel and runs every cell (as Run All does)."""
    if cells is not None:
        (Path(server.root) / name).write_text(json.dumps(notebook(cells), indent=1))
    page.goto(server.page_url(f"lab/tree/{name}"))
    page.wait_for_function("window.jupyterapp?.shell?.currentWidget?.sessionContext?.session"
                           "?.kernel?.status === 'idle'", timeout=90_000)
    if run:
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")


def kernel_execute(page, code: str) -> str:
    """Runs `code` in the notebook's kernel (not in a cell) and returns what it printed."""
    return page.evaluate(_EXECUTE, code)


def kernel_json(page, expr: str):
    """The value of the Python expression `expr` in the notebook's kernel, through JSON."""
    return json.loads(kernel_execute(page, f"import json as _j; print(_j.dumps({expr}))"))


def run_new_cell(page, code: str) -> None:
    """Appends a cell with `code` at the end of the notebook and runs it, as a person would
    (the notebook's own run command: an execute request on the kernel's shell channel)."""
    page.evaluate('''async code => {
      const app = window.jupyterapp;
      const nb = app.shell.currentWidget.content;
      nb.activeCellIndex = nb.widgets.length - 1;
      await app.commands.execute('notebook:insert-cell-below');
      nb.activeCell.model.sharedModel.setSource(code);
      await app.commands.execute('notebook:run-cell');
    }''', code)


def send_to_widget(page, widget_model_id: str, content: dict) -> None:
    """Sends `content` to the kernel as the widget `widget_model_id` would (a custom message
    on its comm), through the page's ipywidgets manager: a front-end event, payload as given."""
    page.evaluate('''async ([id, content]) => {
      const nb = window.jupyterapp.shell.currentWidget.content;
      for (const cell of nb.widgets) {
        for (const out of (cell.outputArea?.widgets ?? [])) {
          for (const w of (out.widgets ?? [])) {
            // The output's WidgetRenderer holds the page's manager (behind a promise since
            // @jupyter-widgets/jupyterlab-manager 5).
            let manager = w._manager;
            if (manager?.promise) { manager = await manager.promise; }
            if (manager?.has_model?.(id)) {
              const model = await manager.get_model(id);
              model.send(content, {});
              return;
            }
          }
        }
      }
      throw new Error("no widget model " + id + " in this notebook's outputs");
    }''', [widget_model_id, content])


# The colours the graph is drawn in: every node's fill and outline, every edge's stroke.
GRAPH_COLOURS = r'''(root) => {
  const colours = new Set();
  for (const el of root.querySelectorAll('.tl-svg g.node > polygon, .tl-svg g.node > path, .tl-svg g.node > ellipse, .tl-svg g.edge > path')) {
    for (const a of ['fill', 'stroke']) {
      const c = (el.getAttribute(a) || '').toLowerCase();
      if (c && c !== 'none' && c !== 'transparent') { colours.add(c); }
    }
  }
  return [...colours];
}'''


# Reads a chart's data source back from BokehJS in the page: what the browser really holds.
BOKEH_SOURCE = '''name => {
  for (const doc of (window.Bokeh?.documents ?? [])) {
    const m = doc.get_model_by_name(name);
    if (m) { return Object.fromEntries([...m.data.entries ? m.data.entries() : Object.entries(m.data)].map(([k, v]) => [k, Array.from(v)])); }
  }
  return null;
}'''


def save_notebook(page, server, name: str) -> int:
    """Saves the notebook in front (File > Save) and returns the size of `name` on disk, bytes."""
    page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function("!window.jupyterapp.shell.currentWidget.context.model.dirty",
                           timeout=60_000)
    return (Path(server.root) / name).stat().st_size


# What the page shows of a cell as it runs, in order: when the cell's first output with
# `data-toast-lab-progress` (the Lab's progress as it builds) and the Lab itself appear (ms
# after `watch`), and each text the progress output held. Installed before the cell runs.
WATCH_OUTPUTS = '''() => {
  const seen = window.tlSeen = {texts: [], building: []};
  const t0 = performance.now();
  const look = () => {
    const p = document.querySelector('[data-toast-lab-progress]');
    if (p) {
      seen.progressMs ??= performance.now() - t0;
      const text = p.textContent;
      if (seen.texts[seen.texts.length - 1] !== text) { seen.texts.push(text); }
    }
    if (document.querySelector('.tl-widget .tl-lab') && seen.widgetMs === undefined) {
      seen.widgetMs = performance.now() - t0;
      seen.progressAtWidget = p ? p.textContent : null;
    }
    const b = document.querySelector('.tl-widget .tl-building:not([hidden])');
    if (b && seen.building[seen.building.length - 1] !== b.textContent) { seen.building.push(b.textContent); }
  };
  new MutationObserver(look).observe(document.body,
    {subtree: true, childList: true, characterData: true, attributes: true});
}'''


def open_step_decisions(server, page, name: str, lab_cell: str):
    """(the Lab, its decisions-beyond-sharding section): notebook `name` with `lab_cell` run at
    1280 x 800, once the graph is drawn, on the Decisions tab."""
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 1280, "height": 800})
    open_notebook(server, page, name, [lab_cell])
    lab = page.locator(".tl-widget .tl-lab")
    expect(lab.locator(".tl-svg g.node").first).to_be_visible(timeout=180_000)
    lab.locator('.tl-tab[data-tab="decisions"]').click()
    return lab, lab.locator(".tl-steps")
