/**
 * The Memory tab: the peak of the step in words, the memory chart with its legend
 * (./memorychart), and an honest word where there is no chart; and the card the Op tab shows
 * for a point of the chart in the kernel-less viewer.
 */
import { h } from './dom';
import * as fmt from './format';
import { MemoryChart, MemoryPoint } from './memorychart';
import { ViewModel } from './viewmodel';

/** What the panel asks of the view that holds it. */
export interface MemoryHost {
  readonly interactive: boolean;
  /** Shows the peak op as a click on the chart's peak does. */
  pickPeak(): void;
}

export function memoryPanel(view: ViewModel, chart: MemoryChart, host: MemoryHost): HTMLElement {
  const m = view.memory;
  const est = view.estimate;
  if (m === undefined) {
    return unavailable('This saved view has no memory chart: it was written before the Lab drew one. Open the plan in a Lab (tl.Lab) to see it.');
  }
  if (m === null) {
    return unavailable(
      view.pricing
        ? `No memory chart yet: ${view.pricing}.`
        : est
        ? 'No memory chart in this view.'
        : 'No memory chart: no mesh was given, so nothing prices the plan\u2019s memory. plan.with_mesh(tl.Mesh({...}, device=...)) does.'
    );
  }
  if (m.positions.length === 0) {
    return unavailable('The step has no ops: nothing is live over it.');
  }
  const capacity = view.mesh?.memory_bytes ?? est?.memory_capacity_bytes ?? null;
  const fits = capacity === null || m.peak_bytes <= capacity;
  void chart.draw({ memory: m, capacity });
  const sampled = m.positions.length < m.steps;
  return h(
    'div',
    { className: 'tl-memory', 'data-peak-op': m.peak_op },
    h(
      'div',
      { className: 'tl-section-note' },
      'Live bytes per device at each op of the step, in the order the ops run, by category. ',
      `Point at the chart to read what is live there; click the peak (▼) or any point to see its op${host.interactive ? '' : ' (in the Op tab)'}.`
    ),
    h(
      'div',
      { className: `tl-big-figure${fits ? '' : ' tl-bad'}` },
      `peak ${fmt.bytes(m.peak_bytes)}`,
      h('span', { className: 'tl-sub' }, capacity !== null ? ` of ${fmt.bytes(capacity)}${fits ? ' — fits' : ' — does not fit'}` : '')
    ),
    h(
      'div',
      { className: 'tl-memory-peak' },
      `at run ${(m.peak_position + 1).toLocaleString()} of ${m.steps.toLocaleString()}: `,
      h(
        'button',
        { className: 'tl-link-button tl-memory-peak-op', title: 'Show this op in the Op tab', onclick: (() => host.pickPeak()) as EventListener },
        `${m.peak_primitive || 'op'} (op ${m.peak_op})`
      ),
      m.peak_scope ? h('span', { className: 'tl-muted' }, ` in ${m.peak_scope}`) : null,
      m.peak_source ? h('div', { className: 'tl-source', title: m.peak_source }, m.peak_source) : null
    ),
    chart.node,
    sampled
      ? h(
          'div',
          { className: 'tl-section-note' },
          `Drawn from ${m.positions.length.toLocaleString()} of the ${m.steps.toLocaleString()} ops: the most and the least live of each stretch of the step, and the peak.`
        )
      : null
  );
}

function unavailable(why: string): HTMLElement {
  return h('div', { className: 'tl-memory tl-memory-unavailable' }, h('div', { className: 'tl-empty' }, why));
}

/** A point of the chart in the Op tab of a saved plan (no kernel to ask for the op's shapes). */
export function memoryPointCard(point: MemoryPoint, view: ViewModel): HTMLElement {
  const m = view.memory;
  const peak = !!m && point.op === m.peak_op;
  const total = Object.values(point.bytes).reduce((a, b) => a + b, 0);
  return h(
    'div',
    { className: 'tl-details', 'data-op': point.op },
    h('div', { className: 'tl-details-title' }, peak ? m!.peak_primitive || 'op' : 'op', h('span', { className: 'tl-muted' }, `  op #${point.op}`)),
    peak && m!.peak_scope ? kv('scope', m!.peak_scope) : null,
    peak && m!.peak_source ? kv('source', h('span', { className: 'tl-mono' }, m!.peak_source)) : null,
    kv('memory', `${fmt.bytes(total)} live${peak ? ', the peak of the step' : ''} (run ${point.position + 1} of ${m?.steps ?? '?'})`),
    Object.entries(point.bytes)
      .filter(([, b]) => b > 0)
      .map(([c, b]) => kv(c, fmt.bytes(b))),
    h('div', { className: 'tl-section-note' }, 'Operand shapes and specs are shown in a live Lab.')
  );
}

function kv(k: string, v: Node | string): HTMLElement {
  return h('div', { className: 'tl-kv' }, h('span', { className: 'tl-k' }, k), h('span', { className: 'tl-v' }, v));
}
