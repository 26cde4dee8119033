/**
 * The side panels of the Lab view, each a pure function of the view model to DOM: decisions
 * (classes and conflicts with their counterfactual prices), the estimate (time by compute and
 * mesh axis, memory by category against capacity), the expert reference rows, the scope tree,
 * the op details and the export snippet.
 */
import { chip, h } from './dom';
import * as fmt from './format';
import { explainedPanel, meshGrids } from './explained';
import { MemoryPoint } from './memorychart';
import { memoryPointCard } from './memorypanel';
import { ScheduleChart, schedulePanel } from './schedulechart';
import {
  ChoiceView,
  ClassView,
  ConflictView,
  DetailsView,
  GroupView,
  LabEvent,
  NodeView,
  resolutionLabel,
  StepDecisionView,
  TensorView,
  ViewModel
} from './viewmodel';

/** What the panels may ask of the view that holds them. */
export interface PanelHost {
  readonly interactive: boolean;
  send(event: LabEvent): void;
  /** Lights classes (an id or several) in the graph; sticky: until clicked again. */
  highlight(classes: number | number[] | null, sticky: boolean): void;
  toggle(group: string): void;
  isExpanded(group: GroupView): boolean;
}

/** What "at stake" means, wherever a class's bytes are shown. */
export const AT_STAKE =
  'At stake: the bytes of the values whose layout this decision changes, summed over the step — not memory held at once';

/** Okabe–Ito, for memory categories and mesh axes (the classes bring their own colours). */
export const CATEGORY_COLORS = [
  '#0072B2', '#E69F00', '#009E73', '#CC79A7', '#56B4E9', '#D55E00', '#F0E442', '#999999'
];

// Decisions -----------------------------------------------------------------------------------

/** `schedule` draws a pipelined plan's schedule under its stages (none: not drawn). */
export function decisionsPanel(view: ViewModel, host: PanelHost, schedule: ScheduleChart | null = null): HTMLElement {
  const est = view.estimate;
  const classes = [...view.classes].sort((a, b) => b.bytes - a.bytes);
  // Minor classes (almost nothing at stake) under one entry, unless the plan shards them.
  const minor = classes.filter(c => c.minor && c.axes.length === 0 && !c.pinned);
  const major = classes.filter(c => !minor.includes(c));
  const active = view.conflicts.filter(c => c.active);
  const inactive = view.conflicts.filter(c => !c.active);
  return h(
    'div',
    { className: 'tl-decisions' },
    h(
      'div',
      { className: 'tl-section-note' },
      view.pricing
        ? `Prices pending: ${view.pricing}. Each choice shows its step time and peak memory once it is ready`
        : view.search.running
          ? 'While the search runs, each choice is priced against its best plan so far'
          : 'Each choice shows its step time and peak memory against the current plan',
      est ? ` (${fmt.seconds(est.step_time_s)}, ${fmt.bytes(est.peak_memory_bytes)}).` : '.',
      host.interactive ? (view.pricing ? ' Click one to pin it now; it is priced then.' : ' Click one to pin it.') : ''
    ),
    stepSection(view, host, schedule),
    h('div', { className: 'tl-section-note tl-at-stake-note' }, `${AT_STAKE}.`),
    h('h4', null, `Classes (${view.classes.length})`),
    major.map(c => classRow(c, view, host)),
    minor.length
      ? h(
          'details',
          { className: 'tl-minor', 'data-minor': minor.length },
          h(
            'summary',
            { title: minor.map(c => c.name).join(', ') },
            `minor: ${minor.length} ${minor.length === 1 ? 'class' : 'classes'} with almost nothing at stake (${fmt.bytes(minor.reduce((a, c) => a + c.bytes, 0))} together), replicated`
          ),
          minor.map(c => classRow(c, view, host))
        )
      : null,
    h('h4', null, `Conflicts (${view.conflicts.length})`),
    view.conflicts.length === 0 ? h('div', { className: 'tl-empty' }, 'No conflicts in this program.') : null,
    active.map(c => conflictRow(c, view, host)),
    inactive.length
      ? h(
          'details',
          { className: 'tl-inactive' },
          h('summary', null, `${inactive.length} inactive (their class is replicated, so they cost nothing)`),
          inactive.map(c => conflictRow(c, view, host))
        )
      : null
  );
}

/** Remat per layer group, the micro-batch count and pipeline stages, above the classes: they
 * move the peak most. A pipelined plan's schedule sits under its stages. */
function stepSection(view: ViewModel, host: PanelHost, schedule: ScheduleChart | null): HTMLElement | null {
  const steps = view.steps ?? [];
  if (steps.length === 0) {
    return null;
  }
  const staged = steps.some(d => d.name.startsWith('pipeline@'));
  const drawn = view.schedule && schedule ? view.schedule : null;
  return h(
    'div',
    { className: 'tl-steps' },
    h('h4', null, `${staged ? 'Remat, micro-batches & stages' : 'Remat & micro-batches'} (${steps.length})`),
    steps.flatMap(d => [stepRow(d, view, host), drawn && d.name === drawn.name ? schedulePanel(drawn, schedule!) : null])
  );
}

function stepRow(d: StepDecisionView, view: ViewModel, host: PanelHost): HTMLElement {
  const now = d.choices.find(ch => ch.current);
  return h(
    'div',
    { className: `tl-decision tl-step${d.pinned ? ' tl-pinned' : ''}`, 'data-step': d.name, 'data-name': d.name },
    h(
      'div',
      { className: 'tl-decision-head' },
      h('span', { className: 'tl-decision-name', title: d.name }, d.label),
      h('span', { className: 'tl-axes' }, now ? now.label : String(d.value)),
      lockControl(d.pinned, d.name, host)
    ),
    choiceList(d.name, d.choices, d.pinned, view, host)
  );
}

function classRow(c: ClassView, view: ViewModel, host: PanelHost): HTMLElement {
  const row = h(
    'div',
    {
      className: `tl-decision${c.pinned ? ' tl-pinned' : ''}`,
      'data-class': c.id,
      'data-name': c.name,
      onmouseenter: (() => host.highlight(c.id, false)) as EventListener,
      onmouseleave: (() => host.highlight(null, false)) as EventListener
    },
    h(
      'div',
      { className: 'tl-decision-head' },
      h('span', {
        className: 'tl-swatch tl-swatch-big',
        style: `background:${c.color}`,
        title: 'Highlight this class in the graph',
        onclick: (() => host.highlight(c.id, true)) as EventListener
      }),
      h('span', { className: 'tl-decision-name' }, c.name),
      h('span', { className: 'tl-axes' }, fmt.axes(c.axes)),
      lockControl(c.pinned, c.name, host)
    ),
    h(
      'div',
      { className: 'tl-decision-facts' },
      `size ${c.size} · ${fmt.bytes(c.bytes)} `,
      h('span', { className: 'tl-at-stake', title: AT_STAKE }, 'at stake'),
      c.layers > 1 ? ` · ${c.layers} layers` : ''
    ),
    choiceList(c.name, c.choices, c.pinned, view, host)
  );
  return row;
}

function conflictRow(c: ConflictView, view: ViewModel, host: PanelHost): HTMLElement {
  const cls = view.classes[c.class_id];
  return h(
    'div',
    {
      className: `tl-decision tl-conflict${c.pinned ? ' tl-pinned' : ''}${c.active ? '' : ' tl-inactive-row'}`,
      'data-conflict': c.id,
      'data-name': c.name,
      onmouseenter: (() => host.highlight(c.class_id, false)) as EventListener,
      onmouseleave: (() => host.highlight(null, false)) as EventListener
    },
    h(
      'div',
      { className: 'tl-decision-head' },
      h('span', { className: 'tl-conflict-mark', title: 'conflict site' }, '⚠'),
      h('span', { className: 'tl-decision-name' }, cls ? chip(cls.color, c.class_name) : c.class_name),
      h('span', { className: 'tl-axes', title: c.active ? c.resolution : '' }, c.active ? resolutionLabel(c) : 'inactive'),
      lockControl(c.pinned, c.name, host)
    ),
    h('div', { className: 'tl-decision-facts', title: c.name }, `at ${c.where}`),
    c.source ? h('div', { className: 'tl-source' }, c.source) : null,
    c.active ? choiceList(c.name, c.choices, c.pinned, view, host) : null
  );
}

function lockControl(pinned: boolean, name: string, host: PanelHost): HTMLElement | null {
  if (!pinned) {
    return null;
  }
  return h(
    'span',
    { className: 'tl-lock' },
    h('span', { title: 'Pinned: the search keeps this decision' }, lockIcon(), 'pinned'),
    host.interactive
      ? h(
          'button',
          {
            className: 'tl-link-button tl-release',
            title: `Unpin ${name}: let the search decide it`,
            onclick: (() => host.send({ event: 'unpin', name })) as EventListener
          },
          'release'
        )
      : null
  );
}

/** A padlock drawn in SVG (emoji fonts are not everywhere). */
export function lockIcon(): SVGSVGElement {
  const NS = 'http://www.w3.org/2000/svg';
  const icon = document.createElementNS(NS, 'svg');
  icon.setAttribute('viewBox', '0 0 12 14');
  icon.setAttribute('class', 'tl-lock-icon');
  icon.innerHTML =
    '<rect x="1" y="6" width="10" height="7.5" rx="1.5" fill="currentColor"/>' +
    '<path d="M3.2 6V4.2a2.8 2.8 0 0 1 5.6 0V6" fill="none" stroke="currentColor" stroke-width="1.6"/>';
  return icon;
}

/** A circled "i" drawn in SVG (the Unicode one is missing from common fonts). */
export function infoIcon(): SVGSVGElement {
  const NS = 'http://www.w3.org/2000/svg';
  const icon = document.createElementNS(NS, 'svg');
  icon.setAttribute('viewBox', '0 0 12 12');
  icon.setAttribute('class', 'tl-info-icon');
  icon.innerHTML =
    '<circle cx="6" cy="6" r="5.3" fill="none" stroke="currentColor" stroke-width="1.2"/>' +
    '<rect x="5.35" y="5" width="1.3" height="4" fill="currentColor"/>' +
    '<circle cx="6" cy="3.3" r=".8" fill="currentColor"/>';
  return icon;
}

function choiceList(
  name: string,
  choices: ChoiceView[],
  pinned: boolean,
  view: ViewModel,
  host: PanelHost
): HTMLElement {
  const est = view.estimate;
  const valid = choices.filter(ch => ch.valid);
  const refused = choices.filter(ch => !ch.valid);
  const noted = valid.filter(ch => ch.note);
  return h(
    'div',
    null,
    h(
      'div',
      { className: 'tl-choices' },
      valid.map(ch => {
        const dt = est && ch.step_time_s !== null ? ch.step_time_s - est.step_time_s : null;
        const dm = est && ch.peak_memory_bytes !== null ? ch.peak_memory_bytes - est.peak_memory_bytes : null;
        const overCapacity =
          !!est && ch.peak_memory_bytes !== null && ch.peak_memory_bytes > est.memory_capacity_bytes;
        const clickable = host.interactive && !ch.current;
        const title = ch.current
          ? pinned
            ? 'The pinned choice'
            : 'The current plan'
          : host.interactive
            ? `Pin ${name} to ${ch.label}`
            : 'Read-only: open this plan in a Lab to change it';
        return h(
          'button',
          {
            className: 'tl-choice' + (ch.current ? ' tl-current' : '') + (overCapacity ? ' tl-over' : ''),
            disabled: !clickable,
            title: overCapacity ? `${title} (does not fit in device memory)` : title,
            'data-label': ch.label,
            'data-value': Array.isArray(ch.value) ? ch.value.join('×') : String(ch.value),
            onclick: (() => host.send({ event: 'pin', name, value: ch.value })) as EventListener
          },
          h(
            'span',
            { className: 'tl-choice-label' },
            ch.current ? `● ${ch.label}` : ch.label,
            ch.note ? h('span', { className: 'tl-note-mark', title: ch.note }, infoIcon()) : null
          ),
          h(
            'span',
            { className: 'tl-choice-cost' },
            h('span', null, ch.step_time_s === null ? '–' : fmt.seconds(ch.step_time_s)),
            !ch.current && dt !== null ? h('span', { className: `tl-delta ${deltaClass(dt)}` }, fmt.delta(dt, fmt.seconds)) : null,
            ' · ',
            h('span', { className: overCapacity ? 'tl-worse' : '' }, fmt.bytes(ch.peak_memory_bytes)),
            !ch.current && dm !== null ? h('span', { className: `tl-delta ${deltaClass(dm)}` }, fmt.delta(dm, fmt.bytes)) : null
          )
        );
      })
    ),
    noted.length
      ? h(
          'ul',
          { className: 'tl-note-list' },
          noted.map(ch =>
            h('li', { className: 'tl-choice-note', 'data-label': ch.label, title: ch.note ?? '' }, infoIcon(), h('span', { className: 'tl-note-label' }, ch.label), ` — ${ch.note}`)
          )
        )
      : null,
    refused.length
      ? h(
          'ul',
          { className: 'tl-refused-list' },
          refused.map(ch =>
            h(
              'li',
              { className: 'tl-refused', 'data-label': ch.label, title: `Refused: ${ch.reason ?? 'not a valid choice'}` },
              h('span', { className: 'tl-refused-label' }, ch.label),
              ` — ${ch.reason ?? 'not a valid choice'}`
            )
          )
        )
      : null
  );
}

function deltaClass(d: number | null): string {
  if (d === null || Math.abs(d) < 1e-15) {
    return '';
  }
  return d < 0 ? 'tl-better' : 'tl-worse';
}

// Estimate ------------------------------------------------------------------------------------

export function estimatePanel(view: ViewModel): HTMLElement {
  const est = view.estimate;
  if (!est) {
    return h('div', { className: 'tl-empty' }, view.pricing ? `No estimate yet: ${view.pricing}.` : 'No estimate: no mesh was given.');
  }
  const axes = Object.entries(est.communication_by_axis ?? {});
  const timeParts: [string, number, string][] = [
    ['compute', est.compute_s, '#0072B2'],
    ...axes.map(([a, s], i): [string, number, string] => [`comm ${a}`, s, CATEGORY_COLORS[(i + 1) % 8]])
  ];
  const memParts = Object.entries(est.memory_breakdown ?? {}).map(
    ([k, v], i): [string, number, string] => [k, v, CATEGORY_COLORS[i % 8]]
  );
  const capacity = est.memory_capacity_bytes;
  return h(
    'div',
    { className: 'tl-estimate' },
    h('h4', null, 'Step time'),
    h(
      'div',
      { className: 'tl-big-figure' },
      fmt.seconds(est.step_time_s),
      h(
        'span',
        { className: 'tl-sub' },
        ` compute ${fmt.seconds(est.compute_s)} · communication ${fmt.seconds(est.communication_s)}`,
        est.exposed_communication_s !== undefined
          ? ` (${fmt.seconds(est.exposed_communication_s)} exposed)`
          : ''
      )
    ),
    stackedBar(timeParts, Math.max(est.compute_s + est.communication_s, est.step_time_s), null, fmt.seconds, 'time'),
    h('h4', null, 'Memory per device'),
    h(
      'div',
      { className: `tl-big-figure${est.feasible ? '' : ' tl-bad'}` },
      fmt.bytes(est.peak_memory_bytes),
      h(
        'span',
        { className: 'tl-sub' },
        ` peak of ${fmt.bytes(capacity)}`,
        est.feasible ? ' — fits' : ' — does not fit'
      )
    ),
    stackedBar(memParts, Math.max(capacity, est.peak_memory_bytes, sum(memParts)) * 1.04, capacity, fmt.bytes, 'memory', !est.feasible),
    h('h4', null, 'Reference: expert strategies on the same cost model'),
    expertsTable(view)
  );
}

function sum(parts: [string, number, string][]): number {
  return parts.reduce((a, p) => a + p[1], 0);
}

function stackedBar(
  parts: [string, number, string][],
  scale: number,
  capacity: number | null,
  unit: (x: number) => string,
  what: string,
  bad = false
): HTMLElement {
  const total = scale > 0 ? scale : 1;
  const bar = h(
    'div',
    { className: `tl-bar${bad ? ' tl-bar-bad' : ''}`, 'data-bar': what },
    parts
      .filter(p => p[1] > 0)
      .map(([name, v, color]) =>
        h('div', {
          className: 'tl-bar-seg',
          style: `width:${(100 * v) / total}%;background:${color}`,
          title: `${name}: ${unit(v)}`
        })
      ),
    capacity !== null
      ? h('div', {
          className: 'tl-capacity',
          style: `left:${Math.min(100, (100 * capacity) / total)}%`,
          title: `capacity ${unit(capacity)}`
        })
      : null
  );
  const legend = h(
    'div',
    { className: 'tl-bar-legend' },
    parts.filter(p => p[1] !== 0).map(([name, v, color]) => h('span', null, h('span', { className: 'tl-swatch', style: `background:${color}` }), `${name} ${unit(v)}`)),
    capacity !== null ? h('span', null, h('span', { className: 'tl-capacity-key' }), `capacity ${unit(capacity)}`) : null
  );
  return h('div', null, bar, legend);
}

function expertsTable(view: ViewModel): HTMLElement {
  const est = view.estimate;
  if (view.experts.length === 0) {
    return h('div', { className: 'tl-empty' }, 'No expert strategy applies to this program and mesh.');
  }
  const rows = [...view.experts].sort((a, b) => a.step_time_s - b.step_time_s);
  return h(
    'table',
    { className: 'tl-table tl-experts' },
    h('thead', null, h('tr', null, h('th', null, 'plan'), h('th', null, 'step time'), h('th', null, 'peak memory'), h('th', null, 'classes'))),
    h(
      'tbody',
      null,
      est
        ? h(
            'tr',
            { className: 'tl-current-row' },
            h('td', null, 'current'),
            h('td', null, fmt.seconds(est.step_time_s)),
            h('td', { className: est.feasible ? '' : 'tl-worse' }, fmt.bytes(est.peak_memory_bytes)),
            h('td', { className: 'tl-muted' }, currentAssignment(view))
          )
        : null,
      rows.map(r =>
        h(
          'tr',
          {
            'data-expert': r.name,
            className: r.ruled_out_by?.length ? 'tl-ruled-out' : '',
            title: r.ruled_out_by?.length ? `Ruled out by your pins (${r.ruled_out_by.join(', ')}): a search under them cannot reach this plan` : ''
          },
          h(
            'td',
            null,
            r.name,
            r.ruled_out_by?.length ? h('div', { className: 'tl-ruled-out-note' }, `ruled out by ${r.ruled_out_by.join(', ')}`) : null
          ),
          h('td', { className: est && !r.ruled_out_by?.length ? deltaClass(r.step_time_s - est.step_time_s) : '' }, fmt.seconds(r.step_time_s)),
          h('td', { className: r.feasible ? '' : 'tl-worse', title: r.feasible ? '' : 'does not fit in device memory' }, fmt.bytes(r.peak_memory_bytes), r.feasible ? '' : ' ✗'),
          h('td', { className: 'tl-muted' }, assignment(r.classes))
        )
      )
    )
  );
}

function assignment(classes: Record<string, string[]>): string {
  const parts = Object.entries(classes)
    .filter(([, a]) => a.length > 0)
    .map(([c, a]) => `${c}→${a.join('×')}`);
  return parts.length ? parts.join(', ') : 'all replicated';
}

function currentAssignment(view: ViewModel): string {
  return assignment(Object.fromEntries(view.classes.map(c => [c.name, c.axes])));
}

// Scopes --------------------------------------------------------------------------------------

export function scopesPanel(view: ViewModel, host: PanelHost): HTMLElement {
  const byId = new Map(view.groups.map(g => [g.id, g]));
  const root = byId.get('') ?? view.groups[0];
  const rows: HTMLElement[] = [];
  const walk = (g: GroupView, depth: number) => {
    for (const id of g.children) {
      const child = byId.get(id);
      if (!child) {
        continue;
      }
      const open = host.isExpanded(child);
      const sel = view.selected?.kind === 'group' && view.selected.id === child.id;
      rows.push(
        h(
          'div',
          {
            className: `tl-scope${sel ? ' tl-selected-row' : ''}`,
            'data-group': child.id,
            style: `padding-left:${depth * 14 + 4}px`,
            title: host.interactive ? 'Expand or collapse this scope in the graph' : 'Show what this scope holds',
            onclick: (() => host.toggle(child.id)) as EventListener
          },
          h('span', { className: 'tl-caret' }, child.children.length ? (open ? '▾' : '▸') : '·'),
          h('span', { className: 'tl-scope-label' }, child.label),
          child.repeat > 1 ? h('span', { className: 'tl-repeat' }, `×${child.repeat}`) : null,
          h('span', { className: 'tl-muted' }, ` ${child.ops} ops`),
          h('span', { className: 'tl-scope-cost' }, `${fmt.seconds(child.compute_s)} + ${fmt.seconds(child.comm_s)}`),
          h('span', { className: 'tl-scope-classes' }, child.classes.map(c => view.classes[c]).filter(c => !!c).map(c => h('span', { className: 'tl-dot', style: `background:${c.color}`, title: c.name }))),
          child.conflicts.some(c => view.conflicts[c]?.active) ? h('span', { className: 'tl-conflict-mark', title: 'holds a conflict site' }, '⚠') : null
        )
      );
      if (open) {
        walk(child, depth + 1);
      }
    }
  };
  if (root) {
    walk(root, 0);
  }
  return h(
    'div',
    { className: 'tl-scopes' },
    h('div', { className: 'tl-section-note' }, 'Scopes (name scopes; repeated layers shown once). Costs: compute + communication per step.'),
    rows.length ? rows : h('div', { className: 'tl-empty' }, 'No scopes.')
  );
}

// Op details ----------------------------------------------------------------------------------

export function detailsPanel(view: ViewModel, localNode: NodeView | null, host: PanelHost, localPoint: MemoryPoint | null = null): HTMLElement {
  const d = view.details;
  const explained = view.explained ?? null;
  if (localPoint && !host.interactive) {
    return memoryPointCard(localPoint, view);
  }
  if (d) {
    return h('div', null, opDetails(d, view), explained && explained.kind === 'op' ? explainedPanel(explained, view, host) : null);
  }
  if (explained) {
    return explainedPanel(explained, view, host);
  }
  if (localNode) {
    // Read-only: the file carries no details for this op, only what its node says.
    return h(
      'div',
      { className: 'tl-details' },
      h('div', { className: 'tl-details-title' }, localNode.label.split('\n')[0]),
      h('div', { className: 'tl-muted' }, `${localNode.kind}${localNode.op !== null ? ` #${localNode.op}` : ''}`),
      kv('compute', fmt.seconds(localNode.compute_s)),
      kv('communication', fmt.seconds(localNode.comm_s)),
      kv('classes', localNode.classes.map(c => view.classes[c]?.name ?? c).join(', ') || 'none'),
      localNode.collectives.length ? kv('collectives', localNode.collectives.join(', ')) : null,
      h('div', { className: 'tl-section-note' }, 'Operand shapes and specs are shown in a live Lab.')
    );
  }
  return h('div', { className: 'tl-empty' }, 'Click an op in the graph to see its shapes, classes and costs, or a collective (an edge\'s label) to see why it is paid.');
}

function opDetails(d: DetailsView, view: ViewModel): HTMLElement {
  const colorOf = new Map(view.classes.map(c => [c.name, c.color]));
  const tensorRows = (label: string, ts: TensorView[]) =>
    ts.map((t, i) =>
      h(
        'tr',
        null,
        h('td', { className: 'tl-muted' }, i === 0 ? label : ''),
        h('td', { className: 'tl-mono' }, `%${t.value}`),
        h('td', { className: 'tl-mono' }, `${t.dtype}[${t.shape.join(',')}]`),
        h(
          'td',
          null,
          t.classes.map((c, k) =>
            c === null
              ? h('span', { className: 'tl-chip tl-chip-none', title: `dim ${k}: no class` }, '–')
              : chip(colorOf.get(c) ?? '#999999', c, `dim ${k}: ${c}`)
          )
        ),
        h('td', { className: 'tl-mono' }, t.spec)
      )
    );
  return h(
    'div',
    { className: 'tl-details', 'data-op': d.op },
    h('div', { className: 'tl-details-title' }, d.primitive, h('span', { className: 'tl-muted' }, `  op #${d.op}`)),
    kv('scope', d.scope || '(top level)'),
    kv('source', h('span', { className: 'tl-mono' }, d.source || 'unknown')),
    h(
      'div',
      { className: 'tl-scroll-x' },
      h(
      'table',
      { className: 'tl-table tl-tensors' },
      h('thead', null, h('tr', null, h('th', null, ''), h('th', null, 'value'), h('th', null, 'type'), h('th', null, 'class of each dim'), h('th', null, 'PartitionSpec'))),
      h('tbody', null, tensorRows('in', d.operands), tensorRows('out', d.results))
      )
    ),
    kv('compute', fmt.seconds(d.compute_s)),
    kv('communication', fmt.seconds(d.comm_s)),
    kv('collectives', d.collectives.length ? d.collectives.join(', ') : 'none'),
    view.memory && view.memory.peak_op === d.op ? kv('memory', h('span', { className: 'tl-memory-peak-note' }, `the step's memory peak: ${fmt.bytes(view.memory.peak_bytes)} live here`)) : null,
    view.mesh ? meshGrids([...d.operands.map(t => ['in', t] as [string, TensorView]), ...d.results.map(t => ['out', t] as [string, TensorView])], view.mesh.axes) : null
  );
}

function kv(k: string, v: Node | string): HTMLElement {
  return h('div', { className: 'tl-kv' }, h('span', { className: 'tl-k' }, k), h('span', { className: 'tl-v' }, v));
}

// Export --------------------------------------------------------------------------------------

export function exportPanel(view: ViewModel, host: PanelHost, path: HTMLInputElement): HTMLElement {
  const pre = h('pre', { className: 'tl-snippet' }, view.snippet || '# no snippet');
  const copy = h('button', { className: 'tl-button', title: 'Copy the snippet' }, 'Copy');
  copy.addEventListener('click', async () => {
    const ok = await copyText(view.snippet, pre);
    copy.textContent = ok ? 'Copied' : 'Select and copy';
    window.setTimeout(() => (copy.textContent = 'Copy'), 1500);
  });
  return h(
    'div',
    { className: 'tl-export' },
    host.interactive
      ? h(
          'div',
          { className: 'tl-export-row' },
          h('label', null, 'plan file ', path),
          h(
            'button',
            {
              className: 'tl-button tl-primary',
              title: 'Write the current plan (and its view) to this file in the kernel’s working directory',
              onclick: (() => host.send({ event: 'export', path: path.value.trim() || 'plan.json' })) as EventListener
            },
            'Export'
          )
        )
      : h('div', { className: 'tl-section-note' }, 'Read-only view of a saved plan.'),
    h('div', { className: 'tl-snippet-head' }, h('span', null, 'Use this plan with jax.jit'), copy),
    pre
  );
}

async function copyText(text: string, pre: HTMLElement): Promise<boolean> {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const range = document.createRange();
    range.selectNodeContents(pre);
    const sel = window.getSelection();
    sel?.removeAllRanges();
    sel?.addRange(range);
    return document.execCommand?.('copy') ?? false;
  }
}
