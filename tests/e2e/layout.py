"""What a reader sees of a drawn Lab or plan: what is cut off, whether the graph fits its pane,
and how large its edge labels are on screen. Shared by the browser tests and looked at with
their screenshots.

`clipped(locator)` lists every element under `locator` that its box's clipping ancestor cuts
(a box outside an ancestor with `overflow: hidden` or `clip`, or outside the viewport's width),
and every element whose own content is cut (`scrollWidth > clientWidth` under
`overflow: hidden`, as `text-overflow: ellipsis` does). Scroll containers (`overflow: auto` or
`scroll`) do not cut: what they hold is reached by scrolling. The graph's SVG is left to
`graph_fit`: it is panned and zoomed, not laid out by CSS. `MEMORY_CHART` reads the memory
chart back from BokehJS: where its peak marker is on the page, its labels and lines.
"""

from __future__ import annotations

CLIPPED = r'''(root) => {
  const out = [];
  const name = el => {
    const cls = typeof el.className === 'string' ? el.className.trim().split(/\s+/).slice(0, 2).join('.') : '';
    const text = (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 60);
    return `${el.tagName.toLowerCase()}${cls ? '.' + cls : ''} "${text}"`;
  };
  const cuts = v => v === 'hidden' || v === 'clip';
  const shown = el => {
    for (let a = el; a && a !== root.parentElement; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.display === 'none' || s.visibility === 'hidden' || a.hidden) { return false; }
    }
    return true;
  };
  const viewportW = document.documentElement.clientWidth;
  for (const el of [root, ...root.querySelectorAll('*')]) {
    if (el.closest('svg') || el.closest('.tl-tooltip') || !shown(el)) { continue; }
    const r = el.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) { continue; }
    const s = getComputedStyle(el);
    if (cuts(s.overflowX) && el.scrollWidth > el.clientWidth + 1) {
      out.push(`${name(el)}: its content is ${el.scrollWidth} px wide in ${el.clientWidth} px`);
    }
    if (cuts(s.overflowY) && el.scrollHeight > el.clientHeight + 1 && !el.matches('.tl-graph-viewport')) {
      out.push(`${name(el)}: its content is ${el.scrollHeight} px high in ${el.clientHeight} px`);
    }
    if (r.left < -0.5 || r.right > viewportW + 0.5) {
      out.push(`${name(el)}: x ${Math.round(r.left)}..${Math.round(r.right)} outside the page's 0..${viewportW}`);
    }
    // the nearest ancestor that clips or scrolls, per axis
    let xDone = false, yDone = false;
    for (let a = el.parentElement; a && !(xDone && yDone); a = a.parentElement) {
      const as = getComputedStyle(a);
      const ar = a.getBoundingClientRect();
      if (!xDone && as.overflowX !== 'visible') {
        xDone = true;
        if (cuts(as.overflowX) && (r.left < ar.left - 1 || r.right > ar.right + 1)) {
          out.push(`${name(el)}: x ${Math.round(r.left)}..${Math.round(r.right)} cut by ${name(a)} at ${Math.round(ar.left)}..${Math.round(ar.right)}`);
        }
      }
      if (!yDone && as.overflowY !== 'visible') {
        yDone = true;
        if (cuts(as.overflowY) && (r.top < ar.top - 1 || r.bottom > ar.bottom + 1)) {
          out.push(`${name(el)}: y ${Math.round(r.top)}..${Math.round(r.bottom)} cut by ${name(a)} at ${Math.round(ar.top)}..${Math.round(ar.bottom)}`);
        }
      }
    }
  }
  return out;
}'''

# The graph's drawing against its pane: every node, edge and label inside the viewport and
# none under the zoom buttons; the scale; the edge labels' font size on screen (px).
GRAPH = r'''(root) => {
  const pane = root.querySelector('.tl-graph-viewport');
  const zoom = root.querySelector('.tl-zoom');
  const controls = root.querySelector('.tl-zoom-controls');
  const p = pane.getBoundingClientRect();
  const c = controls ? controls.getBoundingClientRect() : null;
  const outside = [], covered = [];
  const items = zoom.querySelectorAll('g.node, g.edge, g.cluster, .tl-overlay');
  for (const g of items) {
    const b = g.getBoundingClientRect();
    if (b.width === 0 && b.height === 0) { continue; }
    const id = g.id || g.dataset.node || g.dataset.edge || g.getAttribute('class');
    if (b.left < p.left - 1 || b.right > p.right + 1 || b.top < p.top - 1 || b.bottom > p.bottom + 1) {
      outside.push(`${id}: ${Math.round(b.left)},${Math.round(b.top)}..${Math.round(b.right)},${Math.round(b.bottom)}`);
    }
    if (c && g.matches('g.node, .tl-overlay, g.edge text') &&
        b.left < c.right && b.right > c.left && b.top < c.bottom && b.bottom > c.top) {
      covered.push(id);
    }
  }
  for (const t of zoom.querySelectorAll('g.edge text')) {
    const b = t.getBoundingClientRect();
    if (c && b.left < c.right && b.right > c.left && b.top < c.bottom && b.bottom > c.top) {
      covered.push(`label ${t.textContent}`);
    }
  }
  const px = t => {
    const m = t.getScreenCTM();
    return parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b);
  };
  const labels = [...zoom.querySelectorAll('g.edge text, .tl-collective-badge text')]
    .map(t => ({ text: t.textContent, px: px(t) }));
  const nodeText = [...zoom.querySelectorAll('g.node > text')].map(px);
  const box = zoom.getBoundingClientRect();
  return { pane: [p.width, p.height], drawn: [box.width, box.height], outside, covered, labels,
           nodeTextPx: nodeText.length ? Math.min(...nodeText) : null,
           scale: Number(root.querySelector('.tl-graph').dataset.zoom) };
}'''


def clipped(locator) -> list[str]:
    """What is cut off under `locator` (a Playwright locator of one element); [] when nothing."""
    return locator.evaluate(CLIPPED)


def graph_fit(locator) -> dict:
    """The graph under `locator` against its pane: `outside` (what is drawn beyond the pane),
    `covered` (nodes and labels under the zoom buttons), `labels` (each edge label's text and
    font size on screen, px), `nodeTextPx` (the smallest node text, px), `scale`."""
    return locator.evaluate(GRAPH)


# BokehJS's view of the plot named `name` (undefined until drawn), found through the root views
# of every document in the page, by their models' ids: enumerating Bokeh.index itself fails
# while another notebook shows a view twice.
BOKEH_PLOT_VIEW = '''name => (window.Bokeh?.documents ?? []).flatMap(d => d.roots())
  .map(m => window.Bokeh.index[m.id]).find(v => v && v.model?.name === name)'''

# The memory chart as BokehJS drew it (null until drawn): where its peak marker is on the page
# (x, y), its size, its labels, lines and stacked areas, and its axes' labels.
MEMORY_CHART = '''() => {
  const plot = (''' + BOKEH_PLOT_VIEW + ''')('toast-lab-memory-timeline');
  if (!plot) { return null; }
  const marker = plot.model.renderers.find(r => r.glyph?.type === 'Scatter');
  const data = marker.data_source.data;
  const column = k => data instanceof Map ? data.get(k) : data[k];
  const x = column('x')[0], y = column('y')[0];
  const box = plot.canvas_view.el.getBoundingClientRect();
  return {
    x: box.left + plot.frame.x_scale.compute(x), y: box.top + plot.frame.y_scale.compute(y),
    width: box.width, height: box.height, id: plot.model.id,
    labels: plot.model.center.filter(a => a.type === 'Label').map(a => a.text),
    spans: plot.model.center.filter(a => a.type === 'Span').map(a => [a.dimension, a.location]),
    y_label: plot.model.left[0].axis_label, x_label: plot.model.below[0].axis_label,
    areas: plot.model.renderers.filter(r => r.glyph?.type === 'VAreaStep').length,
  };
}'''


def bytes_text(b: float) -> str:
    """format.ts's bytes(): three significant digits in B, KiB, MiB, GiB or TiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{format(b / scale, '#.3g').rstrip('.')} {unit}"
    return f"{b:.0f} B"
