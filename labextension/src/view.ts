/**
 * The Lab's graph view: one DOM tree that draws a ViewModel and sends LabEvents through a
 * LabEventSink. The ipywidgets view and the kernel-less plan viewer both hold one.
 */
import { chip, fill, h } from './dom';
import * as fmt from './format';
import { GraphPane } from './graph';
import { sharedLayout } from './layout';
import { legendEntries } from './legend';
import { MemoryChart, MemoryPoint, pointAt } from './memorychart';
import { ScheduleChart } from './schedulechart';
import { MemoryHost, memoryPanel } from './memorypanel';
import { AT_STAKE, decisionsPanel, detailsPanel, estimatePanel, exportPanel, infoIcon, PanelHost, scopesPanel } from './panels';
import { EdgeView, EstimateView, GroupView, LabEvent, LabEventSink, NodeView, ViewModel } from './viewmodel';

type Tab = 'decisions' | 'estimate' | 'memory' | 'scopes' | 'details' | 'export';
const TABS: [Tab, string][] = [
  ['decisions', 'Decisions'],
  ['estimate', 'Estimate'],
  ['memory', 'Memory'],
  ['scopes', 'Scopes'],
  ['details', 'Op'],
  ['export', 'Export']
];

export class LabGraphView implements PanelHost, MemoryHost {
  readonly node: HTMLDivElement;
  private view: ViewModel | null = null;
  private opCosts: Float64Array | null = null;
  private graph: GraphPane;
  private header = h('div', { className: 'tl-header' });
  private banner = h('div', { className: 'tl-error', role: 'alert', hidden: true });
  private noticeBar = h('div', { className: 'tl-notice', role: 'status', hidden: true });
  private legend = h('div', { className: 'tl-legend' });
  private tabBar = h('div', { className: 'tl-tabs', role: 'tablist' });
  private tabBody = h('div', { className: 'tl-tab-body' });
  private tab: Tab = 'decisions';
  /** The classes lit in the graph: clicked (kept), and under the pointer. */
  private sticky: number[] | null = null;
  private hovered: number[] | null = null;
  private dismissedError: string | null = null;
  private dismissedNotice: string | null = null;
  /** Read-only mode: which scopes are open, and the node last clicked (no kernel to ask). */
  private localOpen = new Set<string>();
  private localNode: NodeView | null = null;
  /** Read-only mode: the point of the memory chart last clicked. */
  private localPoint: MemoryPoint | null = null;
  private memoryChart = new MemoryChart(point => this.pickMemory(point));
  private scheduleChart = new ScheduleChart();
  private budget = h('input', { className: 'tl-input tl-budget', type: 'number', min: 1, step: 1, value: 30, title: 'Search budget in seconds' });
  private exportPath = h('input', { className: 'tl-input tl-path', type: 'text', value: 'plan.json', spellcheck: 'false' });
  private titleBox = h('div', { className: 'tl-title' });
  private startLine = h('div', { className: 'tl-start', hidden: true });
  private figures = h('div', { className: 'tl-figures' });
  private progress = h('div', { className: 'tl-progress', 'data-running': 'false' });
  private searchMessage = h('div', { className: 'tl-search-message', hidden: true });
  private searchButton!: HTMLButtonElement;
  private stopButton!: HTMLButtonElement;
  /** What the tab body was drawn from, so that an update that changes none of it keeps it. */
  private tabKey = '';
  private tabBarKey = '';
  private legendKey = '';

  constructor(private sink: LabEventSink) {
    this.graph = new GraphPane(sharedLayout(), {
      click: n => this.clickNode(n),
      clickEdge: e => this.clickEdge(e)
    });
    fill(
      this.header,
      h('div', { className: 'tl-title-box' }, this.titleBox, this.startLine),
      this.figures,
      h('div', { className: 'tl-search-box' }, this.makeControls(), this.progress, this.searchMessage)
    );
    this.node = h(
      'div',
      { className: `tl-lab${sink.interactive ? '' : ' tl-readonly'}` },
      this.header,
      this.banner,
      this.noticeBar,
      h(
        'div',
        { className: 'tl-body' },
        h('div', { className: 'tl-left' }, this.legend, this.graph.node),
        h('div', { className: 'tl-right' }, this.tabBar, this.tabBody)
      )
    );
  }

  get interactive(): boolean {
    return this.sink.interactive;
  }

  /** Draws `view`. Panels update at once; the graph when Graphviz has laid it out. */
  update(view: ViewModel, opCosts: Float64Array | null = this.opCosts): Promise<void> {
    const previous = this.view;
    this.view = view;
    this.setOpCosts(opCosts);
    if (!this.interactive && (!previous || previous.graph.dot !== view.graph.dot)) {
      this.localOpen = new Set(view.groups.filter(g => g.expanded).map(g => g.id));
    }
    if (view.details && (!previous || previous.details?.op !== view.details.op)) {
      this.tab = 'details';
    }
    const explained = view.explained ?? null;
    if (explained && (!previous || previous.explained?.id !== explained.id)) {
      this.tab = 'details';
    }
    if (view.selected?.kind === 'class') {
      this.sticky = [Number(view.selected.id)];
    }
    this.renderHeader();
    this.renderBanner();
    this.renderNotice();
    this.renderLegend();
    this.renderTabs();
    const drawn = this.graph.update(view);
    this.node.dataset.viewVersion = String(Number(this.node.dataset.viewVersion ?? 0) + 1);
    return drawn;
  }

  /** Per-op [compute_s, comm_s] (the op_costs buffer): op nodes' tooltips show them. */
  setOpCosts(opCosts: Float64Array | null): void {
    this.opCosts = opCosts;
    this.graph.opCosts = opCosts;
  }

  dispose(): void {
    this.graph.dispose();
    this.memoryChart.dispose();
    this.scheduleChart.dispose();
  }

  // PanelHost -----------------------------------------------------------------------------

  send(event: LabEvent): void {
    if (!this.interactive) {
      return; // read-only: pin, unpin, search, stop and export have nowhere to go
    }
    this.sink.send(event);
  }

  highlight(classes: number | number[] | null, sticky: boolean): void {
    const ids = classes === null ? null : Array.isArray(classes) ? classes : [classes];
    if (sticky) {
      this.sticky = sameIds(this.sticky, ids) ? null : ids;
      this.hovered = null;
    } else {
      this.hovered = ids;
    }
    this.showHighlight();
  }

  /** The classes hovered, else those clicked, lit in the graph and the legend alike. */
  private showHighlight(): void {
    const shown = this.hovered ?? this.sticky;
    this.graph.highlight(shown);
    const key = shown === null ? '' : shown.join(',');
    this.legend.querySelectorAll('.tl-legend-item').forEach(el => {
      el.classList.toggle('tl-on', key !== '' && (el as HTMLElement).dataset.classes === key);
    });
  }

  toggle(group: string): void {
    if (this.interactive) {
      this.graph.focusOn(group);
      this.sink.send({ event: 'toggle', group });
      return;
    }
    // Kernel-less: expand what the file carries (the scope tree) and show it.
    if (this.localOpen.has(group)) {
      this.localOpen.delete(group);
    } else {
      this.localOpen.add(group);
    }
    this.tab = 'scopes';
    this.renderTabs();
  }

  isExpanded(group: GroupView): boolean {
    return this.interactive ? group.expanded : this.localOpen.has(group.id);
  }

  // MemoryHost ----------------------------------------------------------------------------

  pickPeak(): void {
    const m = this.view?.memory;
    if (m && m.positions.length) {
      this.pickMemory(pointAt(m, m.positions.indexOf(m.peak_position)));
    }
  }

  /** A click on the memory chart: its op selected, as a click on the op in the graph does. */
  private pickMemory(point: MemoryPoint): void {
    const drawn = this.view?.graph.nodes.find(n => n.kind === 'op' && n.op === point.op) ?? null;
    if (this.interactive) {
      this.sink.send({ event: 'select', kind: 'op', id: String(point.op) });
      if (this.view?.details?.op === point.op) {
        this.tab = 'details'; // selected already: no new details will switch to it
        this.renderTabs();
      }
      return;
    }
    this.localPoint = point;
    this.localNode = null;
    this.tab = 'details';
    this.renderTabs();
    this.graph.markSelected(drawn ? drawn.id : null);
  }

  // Rendering -----------------------------------------------------------------------------

  /** A click on an edge or its collective badge: its collectives explained (a live Lab). */
  private clickEdge(e: EdgeView): void {
    if (this.interactive) {
      this.sink.send({ event: 'select', kind: 'edge', id: e.id });
    }
  }

  private clickNode(n: NodeView): void {
    if (n.kind === 'group' && n.group !== null) {
      this.toggle(n.group);
    } else if (n.kind === 'op' && n.op !== null) {
      if (this.interactive) {
        this.sink.send({ event: 'select', kind: 'op', id: String(n.op) });
      } else {
        this.localNode = n;
        this.localPoint = null;
        this.tab = 'details';
        this.renderTabs();
        this.graph.markSelected(n.id);
      }
    }
  }

  /**
   * The header's controls are made once and only updated: an update rebuilding them would
   * swallow a click whose mousedown and mouseup fall on either side of it (a search updates the
   * view several times a second, and Stop must work then).
   */
  private makeControls(): HTMLElement {
    this.searchButton = h(
      'button',
      {
        className: 'tl-button tl-primary tl-search',
        title: 'Search for a better plan in the background (pins are kept)',
        onclick: (() => this.send({ event: 'search', budget_s: Math.max(1, Number(this.budget.value) || 30) })) as EventListener
      },
      'Search'
    );
    this.stopButton = h(
      'button',
      {
        className: 'tl-button tl-stop',
        disabled: true,
        title: 'Stop the search and keep the best plan so far',
        onclick: (() => this.send({ event: 'stop' })) as EventListener
      },
      'Stop'
    );
    return this.interactive
      ? h('div', { className: 'tl-search-controls' }, h('label', null, 'budget ', this.budget, ' s'), this.searchButton, this.stopButton)
      : h('div', { className: 'tl-readonly-note', title: 'No kernel: open it with tl.Lab to change it' }, 'saved plan · read-only');
  }

  private renderHeader(): void {
    const v = this.view!;
    const est = v.estimate;
    const s = v.search;
    const mesh = v.mesh
      ? `${Object.entries(v.mesh.axes).map(([a, n]) => `${a}=${n}`).join(' × ')} · ${v.mesh.device}`
      : 'no mesh';
    fill(
      this.titleBox,
      h('span', { className: 'tl-program' }, v.program.name),
      h('span', { className: 'tl-muted' }, ` ${v.program.ops.toLocaleString()} ops · ${mesh}`)
    );
    this.titleBox.title = `${v.program.name}: ${v.program.ops.toLocaleString()} ops · ${mesh}`;
    const start = v.start ?? null;
    const pricing = v.pricing ?? null;
    // Before its prices, the line says why they are not there yet (the kernel's progress
    // line above the Lab counts the seconds).
    this.startLine.hidden = start === null && pricing === null;
    this.startLine.textContent = [start?.label, pricing && `prices pending: ${pricing}`]
      .filter(Boolean).join(' · ');
    this.startLine.title = pricing
      ? `The graph and the decisions are drawn${start ? ` (${start.note})` : ''}; every price follows once the cost model is ready. Pins and a Search clicked meanwhile are kept and applied then.`
      : start
        ? `The plan this Lab started on: ${start.note}`
        : '';
    this.startLine.classList.toggle('tl-pending', pricing !== null);
    fill(
      this.figures,
      figure('step time', est ? fmt.seconds(est.step_time_s) : '–', '', est ? stepSplit(est) : null),
      this.memoryFigure(
        figure(
          'peak memory',
          est ? `${fmt.bytes(est.peak_memory_bytes)} / ${fmt.bytes(est.memory_capacity_bytes)}` : '–',
          est && !est.feasible ? 'tl-bad' : '',
          est && !est.feasible ? h('div', { className: 'tl-figure-split tl-bad' }, 'does not fit') : null
        )
      ),
      figure('pinned', String(v.pinned.length), '')
    );
    this.searchButton.disabled = s.running;
    this.searchButton.title = pricing
      ? 'Search once the cost model is compiled (the click is kept until then)'
      : 'Search for a better plan in the background (pins are kept)';
    this.stopButton.disabled = !s.running;
    this.progress.className = `tl-progress${s.running ? ' tl-running' : ''}`;
    this.progress.dataset.running = String(s.running);
    fill(
      this.progress,
      s.running ? h('span', { className: 'tl-spinner' }) : null,
      s.simulations > 0 || s.running
        ? `${s.running ? 'searching' : 'searched'} · ${s.simulations.toLocaleString()} sims · ${s.elapsed_s.toFixed(1)} s · ${Math.round(s.sims_per_s).toLocaleString()}/s · best ${fmt.seconds(s.best_step_time_s)}`
        : this.interactive
          ? 'not searched yet'
          : '' // a saved plan: how it was found is not in it
    );
    // How the last search ended (its plan count and best, or why nothing fits).
    const message = !s.running && s.message ? s.message : null;
    this.searchMessage.hidden = message === null;
    this.searchMessage.textContent = message ?? '';
    this.searchMessage.title = message ?? '';
    this.searchMessage.classList.toggle('tl-bad', message !== null && s.best_step_time_s === null);
  }

  /** The header's peak memory opens the Memory tab, where the chart shows what makes it. */
  private memoryFigure(el: HTMLElement): HTMLElement {
    if (this.view?.memory) {
      el.classList.add('tl-figure-link');
      el.title = 'Memory over the step: click for the chart';
      el.addEventListener('click', () => {
        this.tab = 'memory';
        this.renderTabs();
      });
    }
    return el;
  }

  private renderBanner(): void {
    const err = this.view!.error;
    if (!err || err === this.dismissedError) {
      this.banner.hidden = true;
      if (!err) {
        this.dismissedError = null;
      }
      return;
    }
    fill(
      this.banner,
      h('span', { className: 'tl-error-icon' }, '⚠'),
      h('span', { className: 'tl-error-text' }, err),
      h(
        'button',
        {
          className: 'tl-link-button',
          title: 'Hide this message',
          onclick: (() => {
            this.dismissedError = err;
            this.banner.hidden = true;
          }) as EventListener
        },
        'dismiss'
      )
    );
    this.banner.hidden = false;
  }

  /** What the last action did besides the obvious ("wrote plan.json"): quiet, dismissable. */
  private renderNotice(): void {
    const v = this.view!;
    const notice = v.notice ?? null;
    // After a search the notice repeats its message, which the header already shows.
    if (!notice || notice === this.dismissedNotice || notice === v.search.message) {
      this.noticeBar.hidden = true;
      if (!notice) {
        this.dismissedNotice = null;
      }
      return;
    }
    fill(
      this.noticeBar,
      h('span', { className: 'tl-notice-icon' }, infoIcon()),
      h('span', { className: 'tl-notice-text' }, notice),
      h(
        'button',
        {
          className: 'tl-link-button',
          title: 'Hide this message',
          onclick: (() => {
            this.dismissedNotice = notice;
            this.noticeBar.hidden = true;
          }) as EventListener
        },
        'dismiss'
      )
    );
    this.noticeBar.hidden = false;
  }

  private renderLegend(): void {
    const v = this.view!;
    const entries = legendEntries(v);
    const key = JSON.stringify([this.sticky, entries.map(e => [e.label, e.color, e.axes, e.classes, e.title])]);
    if (key === this.legendKey) {
      this.showHighlight(); // a new layout has no highlight yet
      return;
    }
    this.legendKey = key;
    const hasConflict = v.conflicts.some(c => c.active);
    fill(
      this.legend,
      entries.map(e =>
        h(
          'span',
          {
            className: `tl-legend-item${e.group ? ' tl-legend-group' : ''}`,
            'data-classes': e.classes.join(','),
            'data-class': e.classes.length === 1 ? e.classes[0] : null,
            'data-legend': e.group ?? 'class',
            title: `${e.title}\n${AT_STAKE}. Click to keep it highlighted.`,
            onmouseenter: (() => this.highlight(e.classes, false)) as EventListener,
            onmouseleave: (() => this.highlight(null, false)) as EventListener,
            onclick: (() => this.highlight(e.classes, true)) as EventListener
          },
          chip(e.color, e.label),
          h('span', { className: 'tl-legend-axes' }, e.axes)
        )
      ),
      hasConflict ? h('span', { className: 'tl-legend-key' }, h('span', { className: 'tl-key-conflict' }), 'conflict site') : null,
      h('span', { className: 'tl-legend-key' }, h('span', { className: 'tl-key-coll' }), 'collective (click it)')
    );
    this.showHighlight();
  }

  private renderTabs(): void {
    const v = this.view!;
    const activeConflicts = v.conflicts.filter(c => c.active).length;
    const badge: Partial<Record<Tab, string>> = {
      decisions: `${v.classes.length}${activeConflicts ? ` · ${activeConflicts}⚠` : ''}`
    };
    // Rebuilt only when they change: a button replaced under the pointer loses its click.
    const barKey = JSON.stringify([this.tab, badge]);
    if (barKey !== this.tabBarKey) {
      this.tabBarKey = barKey;
      fill(
        this.tabBar,
        TABS.map(([t, label]) =>
          h(
            'button',
            {
              className: `tl-tab${t === this.tab ? ' tl-tab-on' : ''}`,
              role: 'tab',
              'data-tab': t,
              'aria-selected': String(t === this.tab),
              onclick: (() => {
                this.tab = t;
                this.renderTabs();
              }) as EventListener
            },
            label,
            badge[t] ? h('span', { className: 'tl-tab-badge' }, badge[t]) : null
          )
        )
      );
    }
    const key = JSON.stringify([this.tab, this.tabInputs(v)]);
    if (key === this.tabKey) {
      return; // e.g. a search's progress: the panel's content is the same
    }
    this.tabKey = key;
    const scroll = this.tabBody.scrollTop;
    const same = this.tabBody.dataset.tab === this.tab;
    let body: HTMLElement;
    switch (this.tab) {
      case 'decisions':
        body = decisionsPanel(v, this, this.scheduleChart);
        break;
      case 'estimate':
        body = estimatePanel(v);
        break;
      case 'memory':
        body = memoryPanel(v, this.memoryChart, this);
        break;
      case 'scopes':
        body = scopesPanel(v, this);
        break;
      case 'details':
        body = detailsPanel(v, this.localNode, this, this.localPoint);
        break;
      case 'export':
        body = exportPanel(v, this, this.exportPath);
        break;
    }
    const focused = document.activeElement;
    fill(this.tabBody, body);
    refocus(focused);
    this.tabBody.dataset.tab = this.tab;
    if (same) {
      this.tabBody.scrollTop = scroll; // an update must not throw the reader back to the top
    }
  }

  /** What the current tab's panel is drawn from (its memo key). */
  private tabInputs(v: ViewModel): unknown {
    switch (this.tab) {
      case 'decisions':
        return [v.classes, v.conflicts, v.steps ?? [], v.schedule ?? null, v.pricing ?? null, v.estimate?.step_time_s, v.estimate?.peak_memory_bytes, v.estimate?.memory_capacity_bytes, v.search.running];
      case 'estimate':
        return [v.estimate, v.experts, v.classes.map(c => c.axes)];
      case 'memory':
        return [v.memory === undefined ? 'absent' : v.memory, v.mesh?.memory_bytes, v.estimate?.memory_capacity_bytes];
      case 'scopes':
        return [v.groups, v.classes.map(c => c.color), v.conflicts.map(c => c.active), v.selected, [...this.localOpen]];
      case 'details':
        return [v.details, v.explained ?? null, v.estimate?.step_time_s, v.mesh, v.classes.map(c => c.color), this.localNode?.id ?? null, this.localPoint, v.memory?.peak_op];
      case 'export':
        return [v.snippet];
    }
  }
}

function sameIds(a: number[] | null, b: number[] | null): boolean {
  return a === b || (a !== null && b !== null && a.join(',') === b.join(','));
}

function figure(label: string, value: string, cls: string, detail: HTMLElement | null = null): HTMLElement {
  return h(
    'div',
    { className: `tl-figure ${cls}`, 'data-figure': label },
    h('div', { className: 'tl-figure-value' }, value),
    h('div', { className: 'tl-figure-label' }, label),
    detail
  );
}

/**
 * The step time split, always in view: compute, then communication per mesh axis (and how
 * much of it is exposed when the estimate overlaps communication with compute).
 */
function stepSplit(est: EstimateView): HTMLElement {
  const axes = Object.entries(est.communication_by_axis ?? {}).filter(([, t]) => t > 0);
  const parts = [
    `compute ${fmt.seconds(est.compute_s)}`,
    ...axes.map(([a, t]) => `${a} ${fmt.seconds(t)}`)
  ];
  if (axes.length === 0) {
    parts.push('no communication');
  }
  if (est.exposed_communication_s !== undefined && est.exposed_communication_s !== null && est.communication_s > 0) {
    parts.push(`${fmt.seconds(est.exposed_communication_s)} exposed`);
  }
  return h(
    'div',
    { className: 'tl-figure-split', title: 'Step time: compute, and communication per mesh axis' },
    parts.join(' · ')
  );
}

/** Updates rebuild the DOM around persistent inputs; give one back the focus it had. */
function refocus(el: Element | null): void {
  if (el instanceof HTMLInputElement && el.isConnected && document.activeElement !== el) {
    el.focus();
  }
}
