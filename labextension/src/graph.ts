/**
 * The graph pane: lays out the view model's DOT (Graphviz-WASM, top to bottom), adds what a
 * static layout cannot say (×N badges, conflict marks with their resolution, collective badges
 * on edges when the DOT left them out), pans and zooms, and highlights a class by its
 * `cls-<id>` SVG classes while dimming the rest.
 */
import { GraphLayout } from './layout';
import { h, fill, svg } from './dom';
import * as fmt from './format';
import { ConflictView, EdgeView, NodeView, resolutionLabel, ViewModel } from './viewmodel';

export interface GraphCallbacks {
  /** A click on a node (not a drag). */
  click(node: NodeView): void;
  /** A click on an edge that pays a collective: its line or its label. */
  clickEdge(edge: EdgeView): void;
}

/**
 * Graphviz draws in points; at scale 1 an 11 pt label is 11 px. A graph opens fitted to its
 * pane, and is fitted again when a group opens or closes, and at each new layout until the
 * reader pans or zooms (then it keeps the reader's frame); below MIN_FIT_SCALE the whole graph is
 * too small to read, so it opens as wide as the pane, at its top, and the wheel scrolls it.
 */
const MIN_FIT_SCALE = 0.8;
const MAX_FIT_SCALE = 1.35;
/** Room kept free around a fitted graph, and under it for the zoom buttons (px). */
const FIT_PAD = 16;
const FIT_PAD_BOTTOM = 40;
/** An edge's label (the collective it pays) is never smaller than this on screen (px). */
const MIN_EDGE_LABEL_PX = 11;

export class GraphPane {
  readonly node: HTMLDivElement;
  private viewport: HTMLDivElement;
  private status: HTMLDivElement;
  private tooltip: HTMLDivElement;
  private svgEl: SVGSVGElement | null = null;
  private zoomG: SVGGElement | null = null;
  private k = 1;
  private tx = 0;
  private ty = 0;
  /** The reader has panned or zoomed since the graph was last fitted: updates keep that. */
  private framedByReader = false;
  private graphW = 0;
  private graphH = 0;
  private dot = '';
  private request = 0;
  private nodes = new Map<string, NodeView>();
  private edges = new Map<string, EdgeView>();
  private view: ViewModel | null = null;
  private highlighted: number[] | null = null;
  /** A group just toggled: the next layout shows it (its cluster, or its node) readably. */
  private pendingFocus: string | null = null;
  /** The layout running now, and the newest view that arrived meanwhile. */
  private laying: Promise<void> | null = null;
  private waiting: ViewModel | null = null;
  /** Per-op [compute_s, comm_s] pairs from the widget's op_costs buffer, when it has one. */
  opCosts: Float64Array | null = null;
  /** ms from update() to the graph in the page, for the last layout (also data-render-ms).
   * data-framing says how the last layout was framed: "whole" (fitted), "width" (as wide as
   * the pane, from the top), "group" (a group just opened or closed, shown readably). */
  lastRenderMs = 0;

  constructor(
    private layout: GraphLayout,
    private callbacks: GraphCallbacks
  ) {
    this.status = h('div', { className: 'tl-graph-status' });
    this.tooltip = h('div', { className: 'tl-tooltip', hidden: true });
    this.viewport = h('div', { className: 'tl-graph-viewport', tabindex: 0 });
    const button = (label: string, title: string, fn: () => void) =>
      h('button', { className: 'tl-icon-button', title, onclick: fn as EventListener }, label);
    const controls = h(
      'div',
      { className: 'tl-zoom-controls' },
      button('+', 'Zoom in', () => this.zoomBy(1.25)),
      button('−', 'Zoom out', () => this.zoomBy(0.8)),
      button('⤢', 'Fit the graph', () => this.fit(true)),
      button('1:1', 'Actual size', () => this.frameByReader(1, 8, 8))
    );
    controls.title = 'Wheel: scroll · Ctrl+wheel: zoom · drag: pan';
    this.node = h(
      'div',
      { className: 'tl-graph' },
      this.viewport,
      controls,
      this.status,
      this.tooltip
    );
    this.installPanZoom();
  }

  /**
   * Draws `view`; re-lays out only when its DOT changed. One layout at a time: views that
   * arrive while Graphviz runs (a search sends several a second) wait, and only the newest of
   * them is laid out next, so the page never works through a backlog of stale graphs.
   */
  async update(view: ViewModel): Promise<void> {
    this.view = view;
    this.nodes = new Map(view.graph.nodes.map(n => [n.id, n]));
    this.edges = new Map(view.graph.edges.map(e => [e.id, e]));
    if (view.graph.dot === this.dot && this.svgEl) {
      this.decorate();
      return;
    }
    if (this.laying) {
      this.waiting = view; // laid out when the current layout is in
      return this.laying;
    }
    this.laying = this.layOut(view);
    try {
      await this.laying;
    } finally {
      this.laying = null;
    }
    const next = this.waiting;
    this.waiting = null;
    if (next) {
      await this.update(this.view ?? next);
    }
  }

  private async layOut(view: ViewModel): Promise<void> {
    const started = performance.now();
    const request = ++this.request;
    this.dot = view.graph.dot;
    const slow = window.setTimeout(() => {
      this.status.textContent = `Laying out ${view.graph.nodes.length} nodes…`;
      this.status.hidden = false;
    }, 150);
    try {
      const text = await this.layout.layout(view.graph.dot);
      if (request !== this.request) {
        return; // disposed while Graphviz ran
      }
      this.install(text);
      this.status.hidden = true;
      this.lastRenderMs = performance.now() - started;
      this.node.dataset.renderMs = this.lastRenderMs.toFixed(1);
      this.node.dataset.renderCount = String(Number(this.node.dataset.renderCount ?? 0) + 1);
    } catch (err) {
      if (request === this.request) {
        this.dot = '';
        this.status.hidden = false;
        fill(this.status, h('span', { className: 'tl-error-text' }, `Graph layout failed: ${err}`));
      }
    } finally {
      window.clearTimeout(slow);
    }
  }

  /** Highlights every node and edge of the classes `ids` and dims the rest; null clears. */
  highlight(ids: number[] | null): void {
    this.highlighted = ids;
    const root = this.svgEl;
    if (!root) {
      return;
    }
    root.querySelectorAll('.tl-hot').forEach(el => el.classList.remove('tl-hot'));
    root.classList.toggle('tl-dimming', ids !== null && ids.length > 0);
    if (ids !== null && ids.length > 0) {
      root.querySelectorAll(ids.map(id => `.cls-${id}`).join(',')).forEach(el => el.classList.add('tl-hot'));
    }
  }

  /**
   * After the next new layout, brings group `group` into view at a readable scale: its open
   * cluster from the top, or its collapsed node centred. (Opening a group makes the graph
   * taller; kept as it was, the zoom would show its new ops too small or off screen.)
   */
  focusOn(group: string): void {
    this.pendingFocus = group;
  }

  /** Marks the node drawn for `nodeId` as selected. */
  markSelected(nodeId: string | null): void {
    this.svgEl?.querySelectorAll('g.node.tl-selected').forEach(el => el.classList.remove('tl-selected'));
    if (nodeId && this.svgEl) {
      this.svgEl.querySelector(`g.node[id="${CSS.escape(nodeId)}"]`)?.classList.add('tl-selected');
    }
  }

  dispose(): void {
    this.request++;
  }

  private install(text: string): void {
    const doc = new DOMParser().parseFromString(text, 'image/svg+xml');
    const parsed = doc.documentElement as unknown as SVGSVGElement;
    const root = document.importNode(parsed, true) as SVGSVGElement;
    const vb = (root.getAttribute('viewBox') ?? '0 0 100 100').split(/[\s,]+/).map(Number);
    this.graphW = vb[2];
    this.graphH = vb[3];
    root.removeAttribute('viewBox');
    root.setAttribute('width', '100%');
    root.setAttribute('height', '100%');
    root.classList.add('tl-svg');
    const zoom = svg('g', { class: 'tl-zoom' });
    while (root.firstChild) {
      zoom.appendChild(root.firstChild);
    }
    root.appendChild(zoom);
    const firstLayout = this.svgEl === null;
    fill(this.viewport, root);
    this.svgEl = root;
    this.zoomG = zoom;
    this.decorate();
    const focus = this.pendingFocus;
    this.pendingFocus = null;
    if (firstLayout || (focus !== null && this.fitScale() >= MIN_FIT_SCALE)) {
      this.fit(false);
    } else if (focus !== null && this.showGroup(focus)) {
      // the group just toggled, framed
    } else if (this.framedByReader) {
      this.applyZoom(); // keep the reader's pan and zoom across updates
    } else {
      this.fit(false); // a new layout (a pin's colours, a conflict's mark) framed as the last
    }
  }

  /** Ties SVG elements to the view model and adds the badges the DOT may have left out. */
  private decorate(): void {
    const root = this.svgEl;
    const view = this.view;
    if (!root || !view) {
      return;
    }
    root.querySelectorAll('.tl-overlay').forEach(el => el.remove());
    const conflicts = view.conflicts;
    const groups = new Map(view.groups.map(g => [g.id, g]));
    root.querySelectorAll<SVGGElement>('g.node').forEach(g => {
      const id = g.id || g.querySelector('title')?.textContent || '';
      const node = this.nodes.get(id);
      if (!node) {
        return;
      }
      g.dataset.node = node.id;
      g.classList.add(`tl-kind-${node.kind}`);
      node.classes.forEach(c => g.classList.add(`cls-${c}`));
      g.querySelector('title')?.remove(); // our tooltip says more
      const text = g.textContent ?? '';
      const box = g.getBBox();
      const group = node.group !== null ? groups.get(node.group) : undefined;
      if (group && group.repeat > 1 && !text.includes(`×${group.repeat}`)) {
        this.pill(g, box.x + box.width - 4, box.y + 2, `×${group.repeat}`, 'tl-repeat-badge');
      }
      const marked = node.conflicts.map(c => conflicts[c]).filter(c => !!c);
      const active = marked.filter(c => c.active);
      if (active.length > 0) {
        g.classList.add('tl-conflict-site');
        const missing = active.filter(c => !text.includes(resolutionLabel(c)));
        if (missing.length > 0) {
          const label = missing.map(c => `⚠ ${c.class_name}: ${resolutionLabel(c)}`).join(' ');
          this.pill(g, box.x + box.width / 2, box.y + box.height + 4, label, 'tl-conflict-badge');
        }
      } else if (marked.length > 0) {
        g.classList.add('tl-conflict-idle'); // its class is replicated: no cost, no warning
      }
    });
    root.querySelectorAll<SVGGElement>('g.edge').forEach(g => {
      const edge = this.edgeFor(g);
      if (!edge) {
        return;
      }
      g.dataset.edge = edge.id;
      edge.classes.forEach(c => g.classList.add(`cls-${c}`));
      const title = g.querySelector('title');
      if (title) {
        title.remove();
      }
      if (edge.badge) {
        g.classList.add('tl-collective-edge');
        if (!(g.textContent ?? '').includes(edge.badge)) {
          const path = g.querySelector('path');
          if (path) {
            const p = path.getPointAtLength(path.getTotalLength() / 2);
            this.pill(g, p.x, p.y, edge.badge, 'tl-collective-badge');
          }
        }
      }
    });
    this.highlight(this.highlighted);
    this.keepEdgeLabelsReadable();
    const sel = view.selected;
    root.querySelectorAll('g.edge.tl-selected').forEach(el => el.classList.remove('tl-selected'));
    if (sel?.kind === 'edge') {
      root.querySelector(`g.edge[data-edge="${CSS.escape(sel.id)}"]`)?.classList.add('tl-selected');
    }
    this.markSelected(
      sel?.kind === 'op'
        ? view.graph.nodes.find(n => n.kind === 'op' && String(n.op) === sel.id)?.id ?? null
        : sel?.kind === 'group'
          ? view.graph.nodes.find(n => n.group === sel.id)?.id ?? null
          : null
    );
  }

  private edgeFor(g: SVGGElement): EdgeView | undefined {
    const byId = this.edges.get(g.id);
    if (byId) {
      return byId;
    }
    const title = g.querySelector('title')?.textContent ?? '';
    const [source, target] = title.split('->');
    for (const e of this.edges.values()) {
      if (e.source === source && e.target === target) {
        return e;
      }
    }
    return undefined;
  }

  /** A rounded label centred at (x, y) in graph coordinates. */
  private pill(parent: SVGGElement, x: number, y: number, text: string, cls: string): void {
    const g = svg('g', { class: `tl-overlay ${cls}` });
    const t = svg('text', { x, y: y + 4, 'text-anchor': 'middle' });
    t.textContent = text;
    g.appendChild(t);
    parent.appendChild(g);
    g.dataset.anchor = `${x} ${y} ${parseFloat(getComputedStyle(t).fontSize) || 10}`;
    const b = t.getBBox();
    const r = svg('rect', {
      x: b.x - 4,
      y: b.y - 1.5,
      width: b.width + 8,
      height: b.height + 3,
      rx: (b.height + 3) / 2
    });
    g.insertBefore(r, t);
  }

  // Pan and zoom ---------------------------------------------------------------------------

  /** Shows group `group` readably (see focusOn); false when it is not drawn. */
  private showGroup(group: string): boolean {
    const root = this.svgEl;
    if (!root) {
      return false;
    }
    const cluster = root.querySelector(`g.cluster[id="${CSS.escape(`cluster:${group}`)}"]`);
    const el = cluster ?? root.querySelector(`g.node[id="${CSS.escape(`group.${group}`)}"]`);
    if (!el) {
      return false;
    }
    this.applyZoom();
    const W = this.viewport.clientWidth || 600;
    const H = this.viewport.clientHeight || 400;
    const pad = 16;
    // The element's box in graph units, from where it is drawn now.
    const vp = this.viewport.getBoundingClientRect();
    const r = el.getBoundingClientRect();
    const x = (r.left - vp.left - this.tx) / this.k;
    const y = (r.top - vp.top - this.ty) / this.k;
    const w = r.width / this.k;
    const hgt = r.height / this.k;
    // An open group: as large as fits, but readable. A closed one: centred at the scale the
    // reader chose (or a readable one), not blown up to fill the pane.
    const k = cluster
      ? Math.min(Math.max(Math.min((W - 2 * pad) / w, (H - 2 * pad) / hgt), MIN_FIT_SCALE), MAX_FIT_SCALE)
      : Math.max(this.k, MIN_FIT_SCALE);
    const tx = w * k <= W - 2 * pad ? (W - w * k) / 2 - x * k : pad - x * k;
    const ty = cluster && hgt * k > H - 2 * pad ? pad - y * k : (H - hgt * k) / 2 - y * k;
    this.frameByReader(k, tx, ty); // (as the reader asked, by opening the group)
    this.node.dataset.framing = 'group';
    return true;
  }

  /** The scales at which the whole graph fits the pane's width, and its height. */
  private fitScales(): [number, number] {
    const W = this.viewport.clientWidth || 600;
    const H = this.viewport.clientHeight || 400;
    return [(W - 2 * FIT_PAD) / this.graphW, (H - FIT_PAD - FIT_PAD_BOTTOM) / this.graphH];
  }

  private fitScale(): number {
    return Math.min(...this.fitScales(), MAX_FIT_SCALE);
  }

  /**
   * The whole graph in the pane, centred, clear of the zoom buttons; when that is too small to
   * read (and not `always`, the Fit button), the whole width from the top.
   */
  private fit(always: boolean): void {
    const W = this.viewport.clientWidth || 600;
    const H = this.viewport.clientHeight || 400;
    const [kW] = this.fitScales();
    let k = this.fitScale();
    let top = FIT_PAD + (H - FIT_PAD - FIT_PAD_BOTTOM - this.graphH * k) / 2;
    let framing = 'whole';
    if (k < MIN_FIT_SCALE && !always) {
      k = Math.min(kW, MAX_FIT_SCALE);
      top = FIT_PAD;
      framing = 'width';
    }
    this.setZoom(k, (W - this.graphW * k) / 2, top);
    this.framedByReader = false;
    this.node.dataset.framing = framing;
  }

  private setZoom(k: number, tx: number, ty: number): void {
    this.k = Math.min(Math.max(k, 0.05), 8);
    this.tx = tx;
    this.ty = ty;
    this.applyZoom();
  }

  /** A pan or zoom the reader chose: later layouts keep it rather than fit themselves. */
  private frameByReader(k: number, tx: number, ty: number): void {
    this.framedByReader = true;
    this.setZoom(k, tx, ty);
  }

  private zoomBy(f: number, cx?: number, cy?: number): void {
    const x = cx ?? this.viewport.clientWidth / 2;
    const y = cy ?? this.viewport.clientHeight / 2;
    const k = Math.min(Math.max(this.k * f, 0.05), 8);
    const r = k / this.k;
    this.frameByReader(k, x - (x - this.tx) * r, y - (y - this.ty) * r);
  }

  private applyZoom(): void {
    this.zoomG?.setAttribute('transform', `translate(${this.tx},${this.ty}) scale(${this.k})`);
    this.node.dataset.zoom = this.k.toFixed(3);
    this.keepEdgeLabelsReadable();
  }

  /**
   * Edge labels grow as the graph shrinks, to stay MIN_EDGE_LABEL_PX on screen: Graphviz's
   * labels by their font size (their anchor stays), the badges added here about their centre.
   */
  private keepEdgeLabelsReadable(): void {
    const root = this.svgEl;
    if (!root) {
      return;
    }
    root.querySelectorAll<SVGTextElement>('g.edge > text').forEach(t => {
      const base = Number((t.dataset.baseSize ??= t.getAttribute('font-size') ?? '12'));
      t.setAttribute('font-size', Math.max(base, MIN_EDGE_LABEL_PX / this.k).toFixed(2));
    });
    root.querySelectorAll<SVGGElement>('.tl-collective-badge').forEach(g => {
      const [x, y, size] = (g.dataset.anchor ?? '0 0 10').split(' ').map(Number);
      const f = Math.max(1, MIN_EDGE_LABEL_PX / (size * this.k));
      g.setAttribute('transform', f > 1 ? `translate(${x} ${y}) scale(${f}) translate(${-x} ${-y})` : '');
    });
  }

  private installPanZoom(): void {
    const vp = this.viewport;
    vp.addEventListener(
      'wheel',
      ev => {
        // The wheel scrolls the graph; with Ctrl or ⌘ (and a trackpad pinch, which sets
        // ctrlKey) it zooms around the pointer.
        ev.preventDefault();
        if (ev.ctrlKey || ev.metaKey) {
          const r = vp.getBoundingClientRect();
          this.zoomBy(Math.exp(-ev.deltaY * 0.004), ev.clientX - r.left, ev.clientY - r.top);
        } else {
          this.frameByReader(this.k, this.tx - (ev.shiftKey ? ev.deltaY : ev.deltaX),
                             this.ty - (ev.shiftKey ? 0 : ev.deltaY));
        }
      },
      { passive: false }
    );
    let drag: { x: number; y: number; tx: number; ty: number; moved: boolean } | null = null;
    vp.addEventListener('pointerdown', ev => {
      if (ev.button !== 0) {
        return;
      }
      drag = { x: ev.clientX, y: ev.clientY, tx: this.tx, ty: this.ty, moved: false };
    });
    vp.addEventListener('pointermove', ev => {
      if (drag) {
        const dx = ev.clientX - drag.x;
        const dy = ev.clientY - drag.y;
        if (!drag.moved && Math.hypot(dx, dy) > 4) {
          drag.moved = true;
          vp.setPointerCapture(ev.pointerId);
          vp.classList.add('tl-panning');
        }
        if (drag.moved) {
          this.frameByReader(this.k, drag.tx + dx, drag.ty + dy);
        }
        return;
      }
      this.hover(ev);
    });
    const end = (ev: PointerEvent) => {
      if (!drag) {
        return;
      }
      const wasDrag = drag.moved;
      drag = null;
      vp.classList.remove('tl-panning');
      if (vp.hasPointerCapture(ev.pointerId)) {
        vp.releasePointerCapture(ev.pointerId);
      }
      if (!wasDrag && ev.type === 'pointerup') {
        const node = this.nodeAt(ev.target);
        const edge = node ? undefined : this.edgeAt(ev.target);
        if (node) {
          this.callbacks.click(node);
        } else if (edge) {
          this.callbacks.clickEdge(edge);
        }
      }
    };
    vp.addEventListener('pointerup', end);
    vp.addEventListener('pointercancel', end);
    vp.addEventListener('pointerleave', () => {
      this.tooltip.hidden = true;
    });
  }

  /** The edge under a click, when it pays a collective (its line, arrow or label). */
  private edgeAt(target: EventTarget | null): EdgeView | undefined {
    const g = (target as Element | null)?.closest?.('g.edge') as SVGGElement | null;
    const edge = g?.dataset.edge ? this.edges.get(g.dataset.edge) : undefined;
    return edge?.badge ? edge : undefined;
  }

  private nodeAt(target: EventTarget | null): NodeView | undefined {
    const el = target as Element | null;
    const g = el?.closest?.('g.node') as SVGGElement | null;
    if (g?.dataset.node) {
      return this.nodes.get(g.dataset.node);
    }
    // An expanded group drawn as a cluster whose DOT id is "cluster:<group id>": a click on
    // its frame or label collapses it, like a click on a collapsed group's node expands it.
    const cluster = el?.closest?.('g.cluster') as SVGGElement | null;
    const group = cluster?.id.startsWith('cluster:') ? cluster.id.slice('cluster:'.length) : null;
    if (group !== null && this.view?.groups.some(x => x.id === group)) {
      return { id: cluster!.id, kind: 'group', group, label: group, op: null, classes: [], conflicts: [],
               compute_s: 0, comm_s: 0, collectives: [], sharded: [] };
    }
    return undefined;
  }

  private hover(ev: PointerEvent): void {
    const target = ev.target as Element;
    const node = target.closest?.('g.node') ? this.nodeAt(target) : undefined;
    const edgeG = target.closest?.('g.edge') as SVGGElement | null;
    const edge = edgeG?.dataset.edge ? this.edges.get(edgeG.dataset.edge) : undefined;
    if (!node && !edge) {
      this.tooltip.hidden = true;
      return;
    }
    fill(this.tooltip, ...(node ? this.describeNode(node) : this.describeEdge(edge!)));
    const r = this.node.getBoundingClientRect();
    this.tooltip.style.left = `${Math.min(ev.clientX - r.left + 14, r.width - 260)}px`;
    this.tooltip.style.top = `${ev.clientY - r.top + 14}px`;
    this.tooltip.hidden = false;
  }

  private className(id: number): string {
    return this.view?.classes[id]?.name ?? `class ${id}`;
  }

  private describeNode(n: NodeView): (Node | string)[] {
    // An op node's `group` is the scope it sits in: its counts are the scope's, not the op's.
    const group = n.kind === 'group' && n.group !== null ? this.view?.groups.find(g => g.id === n.group) : undefined;
    const conflicts = n.conflicts
      .map(c => this.view?.conflicts[c])
      .filter((c): c is ConflictView => !!c);
    return [
      h('div', { className: 'tl-tt-title' }, n.label.split('\n')[0]),
      h('div', null, n.kind === 'group' ? `scope ${group?.id ?? n.group}` : n.kind),
      group ? h('div', null, `${group.ops} ops${group.repeat > 1 ? ` ×${group.repeat} layers` : ''}`) : null,
      h('div', null, `compute ${fmt.seconds(this.cost(n, 0))} · comm ${fmt.seconds(this.cost(n, 1))}`),
      n.classes.length ? h('div', null, `classes: ${n.classes.map(c => this.className(c)).join(', ')}`) : null,
      ...conflicts.map(c =>
        h(
          'div',
          { className: c.active ? 'tl-tt-conflict' : 'tl-tt-idle' },
          c.active ? `conflict of ${c.class_name}: ${resolutionLabel(c)}` : `conflict of ${c.class_name}: idle (${c.class_name} is replicated, so it costs nothing)`
        )
      ),
      ...n.collectives.map(c => h('div', { className: 'tl-tt-coll' }, c)),
      h('div', { className: 'tl-tt-hint' }, n.kind === 'group' ? 'click to expand or collapse' : n.kind === 'op' ? 'click for details' : '')
    ].filter((x): x is HTMLDivElement => !!x);
  }

  /** An op's cost from the op_costs buffer when present (k: 0 compute, 1 comm), else the node's. */
  private cost(n: NodeView, k: 0 | 1): number {
    const c = this.opCosts;
    if (n.kind === 'op' && n.op !== null && c && c.length >= 2 * n.op + 2) {
      return c[2 * n.op + k];
    }
    return k === 0 ? n.compute_s : n.comm_s;
  }

  private describeEdge(e: EdgeView): (Node | string)[] {
    return [
      h('div', { className: 'tl-tt-title' }, e.label),
      e.classes.length ? h('div', null, `classes: ${e.classes.map(c => this.className(c)).join(', ')}`) : '',
      e.badge ? h('div', { className: 'tl-tt-coll' }, e.badge) : '',
      e.badge ? h('div', { className: 'tl-tt-hint' }, 'click to see why it is paid') : ''
    ];
  }
}
