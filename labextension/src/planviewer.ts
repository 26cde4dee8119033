/**
 * Saved plans without a kernel: a MIME renderer for `application/vnd.toast-lab.plan+json`
 * (data `{"plan": <plan file dict>, "view": <ViewModel>, "note"?: string}`, what
 * `display(plan)` emits), also used by the document viewer that opens plan files. A plan that
 * carries its view model (plan format 2: the file's "view" section) is drawn with the same graph
 * view as the Lab, read-only; a format-1 file, or one written without a view, is shown as what
 * it holds: its decisions, estimate, collectives and expert rows, as tables.
 */
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { h, fill } from './dom';
import * as fmt from './format';
import { ExpertRow, isViewModel, ViewModel } from './viewmodel';

export const PLAN_MIME_TYPE = 'application/vnd.toast-lab.plan+json';

/** A plan file dict, as `toast_lab` writes it (plan.save / toast-lab partition --out). */
export interface PlanFile {
  format: 'toast-lab-plan';
  version: number;
  program?: { name?: string; fingerprint?: string; classes?: number; conflicts?: number };
  mesh?: { axes: Record<string, number>; device: string } | null;
  classes?: Record<string, string[]>;
  conflicts?: Record<string, string>;
  pinned?: string[];
  estimate?: Record<string, unknown>;
  experts?: ExpertRow[];
  view?: ViewModel | null;
}

/** What the MIME data or a file says besides the plan: why a part is missing (e.g. no mesh). */
export function readNote(data: unknown): string | null {
  const d = (data ?? {}) as Record<string, unknown>;
  const view = readPlanData(data).view as (ViewModel & { notice?: string | null }) | null;
  if (typeof d.note === 'string') {
    return d.note;
  }
  return view && typeof view.notice === 'string' ? view.notice : null;
}

/** What a MIME bundle or a file holds: a plan, its view model, or both. */
export function readPlanData(data: unknown): { plan: PlanFile | null; view: ViewModel | null } {
  const d = (data ?? {}) as Record<string, unknown>;
  if (isViewModel(d)) {
    return { plan: null, view: d };
  }
  if (d.format === 'toast-lab-plan') {
    const plan = d as unknown as PlanFile;
    return { plan, view: isViewModel(plan.view) ? plan.view : null };
  }
  const plan = d.plan && (d.plan as PlanFile).format === 'toast-lab-plan' ? (d.plan as PlanFile) : null;
  const view = isViewModel(d.view) ? d.view : isViewModel(plan?.view) ? plan!.view! : null;
  return { plan, view };
}

export class PlanRenderer extends Widget implements IRenderMime.IRenderer {
  private graphView: import('./view').LabGraphView | null = null;
  private noteEl = h('div', { className: 'tl-plan-note', hidden: true });

  constructor(private options: IRenderMime.IRendererOptions) {
    super();
    this.addClass('tl-plan-renderer');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = model.data[this.options.mimeType];
    const { plan, view } = readPlanData(data);
    if (view) {
      if (!this.graphView) {
        const { LabGraphView } = await import('./view');
        this.graphView = new LabGraphView({ interactive: false, send: () => undefined });
        fill(this.node, this.noteEl, this.graphView.node);
      }
      const note = readNote(data);
      this.noteEl.hidden = !note;
      this.noteEl.textContent = note ?? '';
      await this.graphView.update(view, null);
      return;
    }
    this.graphView?.dispose();
    this.graphView = null;
    fill(this.node, plan ? planSummary(plan, readNote(data)) : notAPlan());
  }

  dispose(): void {
    this.graphView?.dispose();
    this.graphView = null;
    super.dispose();
  }
}

export const planRendererFactory: IRenderMime.IRendererFactory = {
  safe: true, // JSON drawn as DOM; links in the laid-out SVG are removed
  mimeTypes: [PLAN_MIME_TYPE],
  defaultRank: 60,
  createRenderer: options => new PlanRenderer(options)
};

function notAPlan(): HTMLElement {
  return h(
    'div',
    { className: 'tl-lab tl-plan-summary' },
    h('div', { className: 'tl-error' }, h('span', { className: 'tl-error-icon' }, '⚠'),
      h('span', { className: 'tl-error-text' }, 'This is not a toast-lab plan: expected "format": "toast-lab-plan" or a view model. Open it with the JSON viewer instead.'))
  );
}

/**
 * A plan without a view model (plan format 1, or written where no view could be built): what it
 * holds, as tables — its decisions, the estimate with its collectives and memory, the experts.
 */
export function planSummary(plan: PlanFile, note: string | null = null): HTMLElement {
  const est = plan.estimate ?? {};
  const num = (k: string) => (typeof est[k] === 'number' ? (est[k] as number) : null);
  const pinned = new Set(plan.pinned ?? []);
  const mesh = plan.mesh ? `${Object.entries(plan.mesh.axes).map(([a, n]) => `${a}=${n}`).join(' × ')} · ${plan.mesh.device}` : 'no mesh';
  const classes = Object.entries(plan.classes ?? {});
  const conflicts = Object.entries(plan.conflicts ?? {});
  const collectives = Array.isArray(est.collectives) ? (est.collectives as CollectiveRow[]) : [];
  const memory = Object.entries((est.memory_breakdown ?? {}) as Record<string, number>);
  const step = num('step_time_s');
  const peak = num('peak_memory_bytes');
  const capacity = num('memory_capacity_bytes');
  const why =
    plan.version < 2
      ? `This plan file is format ${plan.version}, from before plan files carried their graph. ` +
        'To draw it, load it and save it again: tl.Plan.load(path, analysis).save(path).'
      : `This plan carries no view model${note ? ` (${note})` : ''}, so there is no graph to draw.`;
  return h(
    'div',
    { className: 'tl-lab tl-readonly tl-plan-summary', 'data-plan-version': plan.version },
    h(
      'div',
      { className: 'tl-header' },
      h('div', { className: 'tl-title' }, h('span', { className: 'tl-program' }, plan.program?.name ?? 'plan'), h('span', { className: 'tl-muted' }, ` ${mesh}`)),
      step !== null ? figure('step time', fmt.seconds(step), '') : null,
      peak !== null
        ? figure('peak memory', `${fmt.bytes(peak)}${capacity !== null ? ` / ${fmt.bytes(capacity)}` : ''}`, est.feasible === false ? 'tl-bad' : '')
        : null,
      h('div', { className: 'tl-readonly-note' }, `plan file v${plan.version} · read-only`)
    ),
    h('div', { className: 'tl-section-note' }, why),
    h('h4', null, `Classes (${classes.length} sharded)`),
    classes.length
      ? table(['class', 'mesh axes', ''], classes.map(([c, a]) => [c, fmt.axes(a), pinned.has(c) ? 'pinned' : '']), 'tl-summary-classes')
      : h('div', { className: 'tl-empty' }, 'Every class replicated.'),
    h('h4', null, `Conflicts (${conflicts.length} active)`),
    conflicts.length
      ? table(['conflict', 'resolution', ''], conflicts.map(([c, r]) => [c, r, pinned.has(c) ? 'pinned' : '']), 'tl-summary-conflicts')
      : h('div', { className: 'tl-empty' }, 'No conflict is active.'),
    step !== null
      ? [
          h('h4', null, 'Estimate per device'),
          table(
            ['', ''],
            [
              ['step time', fmt.seconds(step)],
              ['compute', fmt.seconds(num('compute_s'))],
              ['communication', fmt.seconds(num('communication_s'))],
              ['peak memory', `${fmt.bytes(peak)} of ${fmt.bytes(capacity)}${est.feasible === false ? ' — does not fit' : ' — fits'}`]
            ],
            'tl-summary-estimate'
          )
        ]
      : null,
    collectives.length
      ? [
          h('h4', null, 'Collectives per device per step'),
          table(
            ['kind', 'mesh axes', 'count', 'bytes', 'time'],
            collectives.map(c => [c.kind, fmt.axes(c.axes ?? []), String(Math.round(c.count)), fmt.bytes(c.bytes), fmt.seconds(c.time_s)]),
            'tl-summary-collectives'
          )
        ]
      : null,
    memory.length
      ? [h('h4', null, 'Memory at the peak'), table(['category', 'bytes'], memory.map(([k, v]) => [k, fmt.bytes(v)]), 'tl-summary-memory')]
      : null,
    plan.experts && plan.experts.length
      ? [
          h('h4', null, 'Expert strategies on the same cost model'),
          table(
            ['plan', 'step time', 'peak memory'],
            [...plan.experts].sort((a, b) => a.step_time_s - b.step_time_s).map(r => [r.name, fmt.seconds(r.step_time_s), `${fmt.bytes(r.peak_memory_bytes)}${r.feasible ? '' : ' ✗'}`]),
            'tl-experts'
          )
        ]
      : null
  );
}

interface CollectiveRow {
  kind: string;
  axes?: string[];
  count: number;
  bytes: number;
  time_s: number;
}

function table(head: string[], rows: string[][], cls: string): HTMLElement {
  return h(
    'table',
    { className: `tl-table ${cls}` },
    head.some(x => x) ? h('thead', null, h('tr', null, head.map(x => h('th', null, x)))) : null,
    h('tbody', null, rows.map(r => h('tr', null, r.map((x, i) => h('td', { className: i === 0 && cls.includes('conflicts') ? 'tl-mono' : '' }, x)))))
  );
}

function figure(label: string, value: string, cls: string): HTMLElement {
  return h('div', { className: `tl-figure ${cls}` }, h('div', { className: 'tl-figure-value' }, value), h('div', { className: 'tl-figure-label' }, label));
}
