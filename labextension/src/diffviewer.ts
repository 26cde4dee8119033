/**
 * Two plans side by side: a MIME renderer for `application/vnd.toast-lab.plan-diff+json`, what
 * `tl.diff(a, b)` emits — data `{"diff": PlanDiff.to_dict(), "a": {plan, view}, "b": {plan,
 * view}}`. On top, what differs (classes, conflicts, decisions beyond sharding such as remat,
 * micro-batches and pipeline stages, decision order) and what it costs (step time, memory,
 * collectives); below, each plan in the Lab's graph view, read-only, with the
 * differing classes marked in its legend and decisions, and the nodes and edges whose
 * collectives differ outlined in its graph (where the change costs communication; a class such
 * as the embedding touches nearly every node, so outlining every node it colours says nothing).
 */
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { chip, fill, h } from './dom';
import * as fmt from './format';
import { planSummary, readPlanData } from './planviewer';
import { ClassView, ViewModel } from './viewmodel';

export const DIFF_MIME_TYPE = 'application/vnd.toast-lab.plan-diff+json';

type Pair<T> = [T, T];

/** PlanDiff.to_dict(), as toast_lab/lab/_diff.py writes it. */
export interface PlanDiffDoc {
  format: 'toast-lab-plan-diff';
  version: number;
  program: string;
  names: Pair<string>;
  meshes: Pair<{ axes: Record<string, number>; device: string } | null>;
  classes: { id: number; name: string; before: string[]; after: string[] }[];
  conflicts: { id: number; name: string; class_name: string; before: string | null; after: string | null }[];
  order: Pair<string[]> | null;
  /** Decisions beyond sharding: "remat@<group>", "micro_batches", "pipeline@<stack>". */
  steps?: { name: string; before: string | number; after: string | number }[];
  step_time_s: Pair<number> | null;
  compute_s: Pair<number> | null;
  communication_s: Pair<number> | null;
  peak_memory_bytes: Pair<number> | null;
  feasible: Pair<boolean> | null;
  collectives: { kind: string; axes: string[]; count: Pair<number>; bytes: Pair<number>; time_s: Pair<number> }[];
  memory_breakdown: Record<string, Pair<number>>;
  note: string | null;
}

/** What a node or edge says about communication: its collectives (nodes) or badge (edges). */
type Communication = { badge?: string | null; collectives?: string[] };

let instances = 0;

export class PlanDiffRenderer extends Widget implements IRenderMime.IRenderer {
  private views: import('./view').LabGraphView[] = [];
  private readonly scope = `tl-diff-${++instances}`;

  constructor(private options: IRenderMime.IRendererOptions) {
    super();
    this.addClass('tl-diff-renderer');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = (model.data[this.options.mimeType] ?? {}) as Record<string, unknown>;
    const diff = data.diff as PlanDiffDoc | undefined;
    this.disposeViews();
    if (!diff || diff.format !== 'toast-lab-plan-diff') {
      fill(this.node, h('div', { className: 'tl-lab tl-error' }, 'This is not a toast-lab plan diff: expected {"diff": {"format": "toast-lab-plan-diff", ...}}.'));
      return;
    }
    const a = readPlanData(data.a);
    const b = readPlanData(data.b);
    const { LabGraphView } = await import('./view');
    const panes = [a, b].map((side, i) => {
      const pane = h('div', { className: 'tl-diff-pane', 'data-side': i === 0 ? 'a' : 'b' });
      const title = h('div', { className: 'tl-diff-pane-title' }, h('span', { className: 'tl-diff-side' }, i === 0 ? 'A' : 'B'), diff.names[i]);
      if (side.view) {
        const v = new LabGraphView({ interactive: false, send: () => undefined });
        this.views.push(v);
        fill(pane, title, v.node);
      } else {
        fill(pane, title, side.plan ? planSummary(side.plan) : h('div', { className: 'tl-empty' }, 'no plan'));
      }
      return pane;
    });
    const root = h(
      'div',
      { className: 'tl-lab tl-readonly tl-diff', id: this.scope },
      h('style', null, markRules(this.scope, diff)),
      header(diff, a.view ?? b.view),
      h('div', { className: 'tl-diff-tables' }, decisionsTable(diff, a.view ?? b.view), costsTable(diff)),
      h(
        'div',
        { className: 'tl-diff-legend' },
        h('span', { className: 'tl-diff-key' }),
        'collectives differ here',
        h('span', { className: 'tl-diff-key tl-diff-key-class' }),
        'a class decided differently (legend and decisions)'
      ),
      h('div', { className: 'tl-diff-panes' }, panes)
    );
    fill(this.node, root);
    const drawn: Promise<void>[] = [];
    let k = 0;
    for (const side of [a, b]) {
      if (side.view) {
        drawn.push(this.views[k++].update(side.view, null));
      }
    }
    await Promise.all(drawn);
    if (a.view && b.view) {
      outlineChanges(root, a.view, b.view);
    }
  }

  dispose(): void {
    this.disposeViews();
    super.dispose();
  }

  private disposeViews(): void {
    this.views.forEach(v => v.dispose());
    this.views = [];
  }
}

export const diffRendererFactory: IRenderMime.IRendererFactory = {
  safe: true, // JSON drawn as DOM, like the plan renderer
  mimeTypes: [DIFF_MIME_TYPE],
  defaultRank: 60,
  createRenderer: options => new PlanDiffRenderer(options)
};

function meshText(m: PlanDiffDoc['meshes'][number]): string {
  return m ? `${Object.entries(m.axes).map(([a, n]) => `${a}=${n}`).join(' × ')} · ${m.device}` : 'no mesh';
}

function header(diff: PlanDiffDoc, view: ViewModel | null): HTMLElement {
  const [ma, mb] = diff.meshes;
  const mesh = meshText(ma) === meshText(mb) ? meshText(ma) : `${meshText(ma)} and ${meshText(mb)}`;
  const steps = diff.steps ?? [];
  const changed = diff.classes.length + diff.conflicts.length + steps.length + (diff.order ? 1 : 0);
  const counts = [
    diff.classes.length ? plural(diff.classes.length, 'class', 'classes') : '',
    diff.conflicts.length ? plural(diff.conflicts.length, 'conflict', 'conflicts') : '',
    steps.length ? plural(steps.length, 'step decision', 'step decisions') : ''
  ].filter(Boolean);
  return h(
    'div',
    { className: 'tl-header' },
    h(
      'div',
      { className: 'tl-title' },
      h('span', { className: 'tl-program' }, `${diff.names[0]} → ${diff.names[1]}`),
      h('span', { className: 'tl-muted' }, ` plan diff · ${view?.program.name ?? diff.program} · ${mesh}`)
    ),
    h(
      'div',
      { className: 'tl-figures' },
      pairFigure('step time', diff.step_time_s, fmt.seconds, true),
      pairFigure('peak memory', diff.peak_memory_bytes, fmt.bytes, false, diff.feasible),
      h(
        'div',
        { className: 'tl-figure' },
        h('div', { className: 'tl-figure-value' }, changed === 0 ? 'none' : counts.length ? counts.join(' · ') : plural(0, 'class', 'classes')),
        h('div', { className: 'tl-figure-label' }, changed === 0 ? 'decisions differ' : diff.order && changed === 1 ? 'decision order differs' : 'decided differently')
      )
    )
  );
}

function plural(n: number, one: string, many: string): string {
  return `${n} ${n === 1 ? one : many}`;
}

function pairFigure(label: string, p: Pair<number> | null, unit: (x: number) => string, relative: boolean, feasible: Pair<boolean> | null = null): HTMLElement {
  if (!p) {
    return h('div', { className: 'tl-figure' }, h('div', { className: 'tl-figure-value' }, '–'), h('div', { className: 'tl-figure-label' }, `${label} (no mesh)`));
  }
  const d = p[1] - p[0];
  const rel = relative && p[0] ? ` ${d >= 0 ? '+' : '−'}${Math.abs((100 * d) / p[0]).toFixed(1)}%` : '';
  const bad = feasible && !feasible[1];
  return h(
    'div',
    { className: `tl-figure${bad ? ' tl-bad' : ''}`, 'data-figure': label },
    h('div', { className: 'tl-figure-value' }, `${unit(p[0])} → ${unit(p[1])}`),
    h('div', { className: 'tl-figure-label' }, `${label} `, h('span', { className: `tl-delta ${deltaClass(d)}` }, `${fmt.delta(d, unit)}${rel}`))
  );
}

function deltaClass(d: number): string {
  return Math.abs(d) < fmt.NEGLIGIBLE ? '' : d < 0 ? 'tl-better' : 'tl-worse';
}

function decisionsTable(diff: PlanDiffDoc, view: ViewModel | null): HTMLElement {
  const byId = new Map<number, ClassView>((view?.classes ?? []).map(c => [c.id, c]));
  const name = (id: number, text: string) => {
    const c = byId.get(id);
    return c ? chip(c.color, text) : text;
  };
  const rows: HTMLElement[] = [
    ...diff.classes.map(c =>
      h('tr', { 'data-diff-class': c.id }, h('td', null, name(c.id, c.name)), h('td', null, fmt.axes(c.before)), h('td', null, '→'), h('td', null, fmt.axes(c.after)))
    ),
    ...diff.conflicts.map(c => {
      const cls = view?.conflicts[c.id]?.class_id;
      return h(
        'tr',
        { 'data-diff-conflict': c.id, title: c.name },
        h('td', null, h('span', { className: 'tl-conflict-mark' }, '⚠ '), cls !== undefined ? name(cls, c.class_name) : c.class_name, h('span', { className: 'tl-muted' }, ` ${shortWhere(c.name)}`)),
        h('td', null, c.before ?? 'inactive'),
        h('td', null, '→'),
        h('td', null, c.after ?? 'inactive')
      );
    }),
    ...(diff.steps ?? []).map(c =>
      h('tr', { 'data-diff-step': c.name }, h('td', null, c.name), h('td', null, String(c.before)), h('td', null, '→'), h('td', null, String(c.after)))
    )
  ];
  return h(
    'div',
    { className: 'tl-diff-section' },
    h('h4', null, 'Decisions that differ'),
    rows.length
      ? h('table', { className: 'tl-table tl-diff-decisions' }, h('thead', null, h('tr', null, h('th', null, ''), h('th', null, diff.names[0]), h('th', null, ''), h('th', null, diff.names[1]))), h('tbody', null, rows))
      : h('div', { className: 'tl-empty' }, diff.order ? 'Every class and conflict is decided alike.' : 'The two plans make the same decisions.'),
    diff.order
      ? h(
          'div',
          { className: 'tl-section-note tl-diff-order' },
          `Decision order differs (the class decided first keeps a mesh axis two classes want on one tensor): ${diff.order[0].join(', ')} → ${diff.order[1].join(', ')}`
        )
      : null
  );
}

/** "seq@block0/attn/logits/dot_general" -> "at block0/attn/logits". */
function shortWhere(conflictName: string): string {
  const at = conflictName.indexOf('@');
  if (at < 0) {
    return '';
  }
  const path = conflictName.slice(at + 1).split('/');
  return `at ${path.slice(0, Math.max(1, path.length - 1)).join('/')}`;
}

function costsTable(diff: PlanDiffDoc): HTMLElement {
  if (!diff.step_time_s) {
    return h('div', { className: 'tl-diff-section' }, h('h4', null, 'Costs'), h('div', { className: 'tl-empty' }, diff.note ?? 'No mesh: no costs to compare.'));
  }
  const line = (label: string, p: Pair<number> | null, unit: (x: number) => string) =>
    p
      ? h('tr', { 'data-diff-cost': label }, h('td', null, label), h('td', null, unit(p[0])), h('td', null, unit(p[1])), h('td', { className: `tl-delta ${deltaClass(p[1] - p[0])}` }, fmt.delta(p[1] - p[0], unit)))
      : null;
  const head = h('thead', null, h('tr', null, h('th', null, ''), h('th', null, diff.names[0]), h('th', null, diff.names[1]), h('th', null, 'change')));
  return h(
    'div',
    { className: 'tl-diff-section' },
    h('h4', null, 'What it costs, per device per step'),
    h(
      'table',
      { className: 'tl-table tl-diff-costs' },
      head,
      h(
        'tbody',
        null,
        line('step time', diff.step_time_s, fmt.seconds),
        line('compute', diff.compute_s, fmt.seconds),
        line('communication', diff.communication_s, fmt.seconds),
        line('peak memory', diff.peak_memory_bytes, fmt.bytes)
      )
    ),
    h('h4', null, 'Collectives that differ'),
    diff.collectives.length
      ? h(
          'table',
          { className: 'tl-table tl-diff-collectives' },
          h('thead', null, h('tr', null, h('th', null, 'collective'), h('th', null, diff.names[0]), h('th', null, diff.names[1]), h('th', null, 'change'))),
          h(
            'tbody',
            null,
            diff.collectives.map(c => {
              const dc = c.count[1] - c.count[0];
              const dt = c.time_s[1] - c.time_s[0];
              return h(
                'tr',
                { 'data-diff-collective': `${c.kind} ${c.axes.join('×')}` },
                h('td', null, `${c.kind} `, h('span', { className: 'tl-muted' }, c.axes.join('×') || '–')),
                h('td', null, countBytes(c.count[0], c.bytes[0])),
                h('td', null, countBytes(c.count[1], c.bytes[1])),
                h('td', { className: `tl-delta ${deltaClass(dt)}` }, `${dc === 0 ? '±0' : `${dc > 0 ? '+' : '−'}${Math.abs(Math.round(dc))}`} · ${fmt.delta(dt, fmt.seconds)}`)
              );
            })
          )
        )
      : h('div', { className: 'tl-empty' }, 'The same collectives.'),
    diff.note ? h('div', { className: 'tl-section-note' }, diff.note) : null
  );
}

function countBytes(count: number, bytes: number): string {
  return count === 0 && bytes === 0 ? '–' : `${Math.round(count)} × · ${fmt.bytes(bytes)}`;
}

/**
 * CSS scoped to one diff: the differing classes marked in both legends and both decision lists
 * (these re-render on hover and tab changes, so rules, not DOM classes).
 */
function markRules(scope: string, diff: PlanDiffDoc): string {
  const sel: string[] = [];
  for (const c of diff.classes) {
    sel.push(`#${scope} .tl-legend-item[data-class="${c.id}"]`, `#${scope} .tl-decision[data-class="${c.id}"]`);
  }
  for (const c of diff.conflicts) {
    sel.push(`#${scope} .tl-decision[data-conflict="${c.id}"]`);
  }
  return sel.length ? `${sel.join(',\n')} { outline: 2px solid var(--tl-diff); outline-offset: 1px; background: var(--tl-diff-bg); }` : '';
}

/**
 * Outlines, in both graphs, the nodes and edges whose collectives differ between the two views
 * (same analysis and open groups: the same node ids). The graphs are static here, so classes
 * added after layout stay.
 */
function outlineChanges(root: HTMLElement, a: ViewModel, b: ViewModel): void {
  const key = (x: Communication) => JSON.stringify([x.badge ?? null, x.collectives ?? []]);
  const changed = new Set<string>();
  const nodesB = new Map(b.graph.nodes.map(n => [n.id, n]));
  for (const n of a.graph.nodes) {
    const m = nodesB.get(n.id);
    if (m && key(n) !== key(m)) {
      changed.add(n.id);
    }
  }
  const edgesB = new Map(b.graph.edges.map(e => [e.id, e]));
  for (const e of a.graph.edges) {
    const f = edgesB.get(e.id);
    if (f && key(e) !== key(f)) {
      changed.add(e.id);
    }
  }
  root.querySelectorAll<SVGGElement>('.tl-svg g.node, .tl-svg g.edge').forEach(g => {
    const id = g.dataset.node ?? g.dataset.edge;
    if (id && changed.has(id)) {
      g.classList.add('tl-diff-changed');
    }
  });
  root.dataset.changed = String(changed.size);
}
