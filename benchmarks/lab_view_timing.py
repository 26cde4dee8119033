"""Times the Lab's graph view in a real Chromium (prints; asserts nothing).

- time to first rendered graph: from the view model reaching the page to its SVG in the page,
  for the GPT fixture (tests/data/lab_view_gpt.json) and a synthetic 24-layer graph;
- event → page update: a pin click in the widget to the page showing the kernel's answer.

Goals: first graph < 2 s, event → update < 200 ms. Needs Chromium (/usr/bin/chromium) and the
built extension, like tests/e2e. Run: PYTHONPATH=. python -m pytest benchmarks/lab_view_timing.py -s -q
"""

from __future__ import annotations

import json
import statistics

import pytest

from tests.e2e.conftest import REPO, write_json  # noqa: F401  (fixtures below)
from tests.e2e.conftest import browser_context, chromium_path, lab_server, page  # noqa: F401
from tests.e2e.test_lab_widget import SETUP, _notebook
from tests.e2e.viewmodels import gpt_view, plan_file, synthetic_view

# Time from the view update to the graph in the page, as the graph pane measures it
# (GraphPane.update: Graphviz in the worker, SVG parsed, decorated and inserted).
RENDER_MS = "document.querySelector('.tl-graph').dataset.renderMs"


def _first_graph_ms(lab_server, page, name: str, view: dict) -> tuple[float, float]:
    """(ms from navigation start to the graph in the page, ms the graph pane itself took)."""
    write_json(lab_server.root / name, plan_file(view))
    page.goto(lab_server.page_url(f"lab/tree/{name}"))
    page.wait_for_selector(".tl-graph[data-render-ms]", timeout=120_000)
    return (page.evaluate("performance.now()"), float(page.evaluate(RENDER_MS)))


def test_time_to_first_graph(lab_server, page):
    rows = []
    for name, view in (("gpt.plan.json", gpt_view()), ("synthetic24.plan.json", synthetic_view(24))):
        nodes = len(view["graph"]["nodes"])
        _first_graph_ms(lab_server, page, name, view)  # warm: browser caches, Graphviz's wasm
        page_ms, graph_ms = _first_graph_ms(lab_server, page, name, view)
        rows.append((name, nodes, len(view["graph"]["edges"]), graph_ms, page_ms))
    print("\nfirst rendered graph (kernel-less viewer, warm browser cache)")
    print(f"{'graph':24} {'nodes':>6} {'edges':>6} {'layout+draw ms':>15} {'page load→graph ms':>19}")
    for name, n, e, graph_ms, page_ms in rows:
        print(f"{name:24} {n:6d} {e:6d} {graph_ms:15.0f} {page_ms:19.0f}")


def test_event_to_update_latency(lab_server, page):
    fixture = REPO / "tests" / "data" / "lab_view_gpt.json"
    write_json(lab_server.root / "latency.ipynb", _notebook([SETUP % {"fixture": str(fixture)}]))
    page.goto(lab_server.page_url("lab/tree/latency.ipynb"))
    page.wait_for_function("window.jupyterapp?.shell?.currentWidget?.sessionContext?.session?.kernel?.status === 'idle'", timeout=60_000)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_selector(".tl-widget .tl-svg g.node", timeout=90_000)
    # Pin embed to model and back to replicated, alternately: each a round trip to the kernel
    # (message, the callback's new view, the view traitlet back) and a redraw of the panels.
    measure = '''async label => {
      const row = () => document.querySelector('.tl-widget .tl-decision[data-name="embed"]');
      const before = row().querySelector('.tl-axes').textContent;
      const t0 = performance.now();
      row().querySelector(`.tl-choice[data-label="${label}"]`).click();
      return await new Promise(resolve => {
        const obs = new MutationObserver(() => {
          const r = row();
          if (r && r.querySelector('.tl-axes').textContent !== before) {
            obs.disconnect(); resolve(performance.now() - t0);
          }
        });
        obs.observe(document.querySelector('.tl-widget'), {subtree: true, childList: true, characterData: true});
      });
    }'''
    times = [page.evaluate(measure, "model" if i % 2 == 0 else "replicated") for i in range(12)]
    print(f"\nevent → page update (pin, kernel answers with a new view), {len(times)} clicks: "
          f"median {statistics.median(times):.0f} ms, min {min(times):.0f}, max {max(times):.0f}")
