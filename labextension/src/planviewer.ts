/**
 * Saved plans without a kernel: a MIME renderer for `application/vnd.toast-lab.plan+json`
 * (data `{"plan": <plan file dict>, "view": <ViewModel>}`), also used by the document viewer
 * that opens plan files. A plan file that carries its view model (format v2: the plan dict with
 * a "view" key) is drawn with the same graph view as the Lab, read-only; an older file without
 * one is shown as its decisions and estimate.
 */
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { h, fill } from './dom';
import * as fmt from './format';
import { isViewModel, ViewModel } from './viewmodel';

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
  view?: ViewModel;
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

  constructor(private options: IRenderMime.IRendererOptions) {
    super();
    this.addClass('tl-plan-renderer');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const { plan, view } = readPlanData(model.data[this.options.mimeType]);
    if (view) {
      if (!this.graphView) {
        const { LabGraphView } = await import('./view');
        this.graphView = new LabGraphView({ interactive: false, send: () => undefined });
        fill(this.node, this.graphView.node);
      }
      await this.graphView.update(view, null);
      return;
    }
    this.graphView?.dispose();
    this.graphView = null;
    fill(this.node, plan ? planSummary(plan) : notAPlan());
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

/** A plan file without a view model: its decisions and estimate as tables. */
function planSummary(plan: PlanFile): HTMLElement {
  const est = plan.estimate ?? {};
  const num = (k: string) => (typeof est[k] === 'number' ? (est[k] as number) : null);
  const pinned = new Set(plan.pinned ?? []);
  const mesh = plan.mesh ? `${Object.entries(plan.mesh.axes).map(([a, n]) => `${a}=${n}`).join(' × ')} · ${plan.mesh.device}` : 'no mesh';
  return h(
    'div',
    { className: 'tl-lab tl-readonly tl-plan-summary' },
    h(
      'div',
      { className: 'tl-header' },
      h('div', { className: 'tl-title' }, h('span', { className: 'tl-program' }, plan.program?.name ?? 'plan'), h('span', { className: 'tl-muted' }, ` ${mesh}`)),
      h('div', { className: 'tl-readonly-note' }, `plan file v${plan.version} · read-only`)
    ),
    h('div', { className: 'tl-section-note' }, 'This plan file carries no view model, so there is no graph to draw. Save it again with lab.export(...) to get one.'),
    num('step_time_s') !== null
      ? h('div', { className: 'tl-kv' }, h('span', { className: 'tl-k' }, 'step time'), h('span', { className: 'tl-v' }, fmt.seconds(num('step_time_s'))))
      : null,
    num('peak_memory_bytes') !== null
      ? h('div', { className: 'tl-kv' }, h('span', { className: 'tl-k' }, 'peak memory'), h('span', { className: 'tl-v' }, fmt.bytes(num('peak_memory_bytes'))))
      : null,
    h('h4', null, 'Classes'),
    h(
      'table',
      { className: 'tl-table' },
      h('tbody', null, Object.entries(plan.classes ?? {}).map(([c, a]) => h('tr', null, h('td', null, c), h('td', null, fmt.axes(a)), h('td', null, pinned.has(c) ? 'pinned' : ''))))
    ),
    h('h4', null, 'Conflicts'),
    h(
      'table',
      { className: 'tl-table' },
      h('tbody', null, Object.entries(plan.conflicts ?? {}).map(([c, r]) => h('tr', null, h('td', { className: 'tl-mono' }, c), h('td', null, r), h('td', null, pinned.has(c) ? 'pinned' : ''))))
    )
  );
}
