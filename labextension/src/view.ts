/**
 * The Lab's graph view: one DOM tree that draws a ViewModel and sends LabEvents through a
 * LabEventSink. The ipywidgets view and the kernel-less plan viewer both hold one.
 */
import { chip, fill, h } from './dom';
import * as fmt from './format';
import { GraphPane } from './graph';
import { sharedLayout } from './layout';
import { decisionsPanel, detailsPanel, estimatePanel, exportPanel, PanelHost, scopesPanel } from './panels';
import { GroupView, LabEvent, LabEventSink, NodeView, ViewModel } from './viewmodel';

type Tab = 'decisions' | 'estimate' | 'scopes' | 'details' | 'export';
const TABS: [Tab, string][] = [
  ['decisions', 'Decisions'],
  ['estimate', 'Estimate'],
  ['scopes', 'Scopes'],
  ['details', 'Op'],
  ['export', 'Export']
];

export class LabGraphView implements PanelHost {
  readonly node: HTMLDivElement;
  private view: ViewModel | null = null;
  private opCosts: Float64Array | null = null;
  private graph: GraphPane;
  private header = h('div', { className: 'tl-header' });
  private banner = h('div', { className: 'tl-error', role: 'alert', hidden: true });
  private legend = h('div', { className: 'tl-legend' });
  private tabBar = h('div', { className: 'tl-tabs', role: 'tablist' });
  private tabBody = h('div', { className: 'tl-tab-body' });
  private tab: Tab = 'decisions';
  private sticky: number | null = null;
  private dismissedError: string | null = null;
  /** Read-only mode: which scopes are open, and the node last clicked (no kernel to ask). */
  private localOpen = new Set<string>();
  private localNode: NodeView | null = null;
  private budget = h('input', { className: 'tl-input tl-budget', type: 'number', min: 1, step: 1, value: 30, title: 'Search budget in seconds' });
  private exportPath = h('input', { className: 'tl-input tl-path', type: 'text', value: 'plan.json', spellcheck: 'false' });

  constructor(private sink: LabEventSink) {
    this.graph = new GraphPane(sharedLayout(), { click: n => this.clickNode(n) });
    this.node = h(
      'div',
      { className: `tl-lab${sink.interactive ? '' : ' tl-readonly'}` },
      this.header,
      this.banner,
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
    if (view.selected?.kind === 'class') {
      this.sticky = Number(view.selected.id);
    }
    this.renderHeader();
    this.renderBanner();
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
  }

  // PanelHost -----------------------------------------------------------------------------

  send(event: LabEvent): void {
    if (!this.interactive) {
      return; // read-only: pin, unpin, search, stop and export have nowhere to go
    }
    this.sink.send(event);
  }

  highlight(classId: number | null, sticky: boolean): void {
    if (sticky) {
      this.sticky = this.sticky === classId ? null : classId;
      this.renderLegend();
    }
    const shown = classId ?? this.sticky;
    this.graph.highlight(sticky ? this.sticky : shown);
    this.legend.querySelectorAll('.tl-legend-item').forEach(el => {
      el.classList.toggle('tl-on', Number((el as HTMLElement).dataset.class) === (sticky ? this.sticky : shown));
    });
  }

  toggle(group: string): void {
    if (this.interactive) {
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

  // Rendering -----------------------------------------------------------------------------

  private clickNode(n: NodeView): void {
    if (n.kind === 'group' && n.group !== null) {
      this.toggle(n.group);
    } else if (n.kind === 'op' && n.op !== null) {
      if (this.interactive) {
        this.sink.send({ event: 'select', kind: 'op', id: String(n.op) });
      } else {
        this.localNode = n;
        this.tab = 'details';
        this.renderTabs();
        this.graph.markSelected(n.id);
      }
    }
  }

  private renderHeader(): void {
    const v = this.view!;
    const est = v.estimate;
    const s = v.search;
    const mesh = v.mesh
      ? `${Object.entries(v.mesh.axes).map(([a, n]) => `${a}=${n}`).join(' × ')} · ${v.mesh.device}`
      : 'no mesh';
    const figures = h(
      'div',
      { className: 'tl-figures' },
      figure('step time', est ? fmt.seconds(est.step_time_s) : '–', ''),
      figure(
        'peak memory',
        est ? `${fmt.bytes(est.peak_memory_bytes)} / ${fmt.bytes(est.memory_capacity_bytes)}` : '–',
        est && !est.feasible ? 'tl-bad' : ''
      ),
      figure('pinned', String(v.pinned.length), '')
    );
    const progress = h(
      'div',
      { className: `tl-progress${s.running ? ' tl-running' : ''}`, 'data-running': String(s.running) },
      s.running ? h('span', { className: 'tl-spinner' }) : null,
      s.simulations > 0 || s.running
        ? `${s.running ? 'searching' : 'searched'} · ${s.simulations.toLocaleString()} sims · ${s.elapsed_s.toFixed(1)} s · ${Math.round(s.sims_per_s).toLocaleString()}/s · best ${fmt.seconds(s.best_step_time_s)}`
        : this.interactive
          ? 'not searched yet'
          : '' // a saved plan: how it was found is not in it
    );
    const controls = this.interactive
      ? h(
          'div',
          { className: 'tl-search-controls' },
          h('label', null, 'budget ', this.budget, ' s'),
          h(
            'button',
            {
              className: 'tl-button tl-primary tl-search',
              disabled: s.running,
              title: 'Search for a better plan in the background (pins are kept)',
              onclick: (() => this.send({ event: 'search', budget_s: Math.max(1, Number(this.budget.value) || 30) })) as EventListener
            },
            'Search'
          ),
          h(
            'button',
            {
              className: 'tl-button tl-stop',
              disabled: !s.running,
              title: 'Stop the search and keep the best plan so far',
              onclick: (() => this.send({ event: 'stop' })) as EventListener
            },
            'Stop'
          )
        )
      : h('div', { className: 'tl-readonly-note', title: 'No kernel: open it with tl.Lab to change it' }, 'saved plan · read-only');
    const focused = document.activeElement;
    fill(
      this.header,
      h(
        'div',
        { className: 'tl-title' },
        h('span', { className: 'tl-program' }, v.program.name),
        h('span', { className: 'tl-muted' }, ` ${v.program.ops.toLocaleString()} ops · ${mesh}`)
      ),
      figures,
      h('div', { className: 'tl-search-box' }, controls, progress)
    );
    refocus(focused);
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

  private renderLegend(): void {
    const v = this.view!;
    fill(
      this.legend,
      v.classes.map(c =>
        h(
          'span',
          {
            className: `tl-legend-item${this.sticky === c.id ? ' tl-on' : ''}`,
            'data-class': c.id,
            title: `${c.name}: size ${c.size}, ${fmt.bytes(c.bytes)} at stake, ${fmt.axes(c.axes)}. Click to keep it highlighted.`,
            onmouseenter: (() => this.highlight(c.id, false)) as EventListener,
            onmouseleave: (() => this.highlight(null, false)) as EventListener,
            onclick: (() => this.highlight(c.id, true)) as EventListener
          },
          chip(c.color, c.name),
          h('span', { className: 'tl-legend-axes' }, c.axes.length ? c.axes.join('×') : '')
        )
      ),
      h('span', { className: 'tl-legend-key' }, h('span', { className: 'tl-key-conflict' }), 'conflict site'),
      h('span', { className: 'tl-legend-key' }, h('span', { className: 'tl-key-coll' }), 'collective')
    );
    this.graph.highlight(this.sticky);
  }

  private renderTabs(): void {
    const v = this.view!;
    const activeConflicts = v.conflicts.filter(c => c.active).length;
    const badge: Partial<Record<Tab, string>> = {
      decisions: `${v.classes.length}${activeConflicts ? ` · ${activeConflicts}⚠` : ''}`
    };
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
    const scroll = this.tabBody.scrollTop;
    const same = this.tabBody.dataset.tab === this.tab;
    let body: HTMLElement;
    switch (this.tab) {
      case 'decisions':
        body = decisionsPanel(v, this);
        break;
      case 'estimate':
        body = estimatePanel(v);
        break;
      case 'scopes':
        body = scopesPanel(v, this);
        break;
      case 'details':
        body = detailsPanel(v, this.localNode);
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
}

function figure(label: string, value: string, cls: string): HTMLElement {
  return h('div', { className: `tl-figure ${cls}` }, h('div', { className: 'tl-figure-value' }, value), h('div', { className: 'tl-figure-label' }, label));
}

/** Updates rebuild the DOM around persistent inputs; give one back the focus it had. */
function refocus(el: Element | null): void {
  if (el instanceof HTMLInputElement && el.isConnected && document.activeElement !== el) {
    el.focus();
  }
}
