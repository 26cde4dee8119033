/**
 * The Op tab's two pictures of a plan at one op: every collective it pays explained (which
 * classes and which op ask for it, the user's source line, bytes and time, the choice that
 * would remove it with that choice's price, a click pinning it), and each tensor's blocks over
 * the device grid (which device holds which block, for meshes of any rank).
 */
import { chip, h } from './dom';
import * as fmt from './format';
import { CollectiveView, ExplainedView, LabEvent, TensorView, ViewModel } from './viewmodel';

interface Host {
  readonly interactive: boolean;
  send(event: LabEvent): void;
}

export function explainedPanel(x: ExplainedView, view: ViewModel, host: Host): HTMLElement {
  const title = x.kind === 'edge' ? `Collectives on ${x.subject}` : `Collectives of ${x.subject}`;
  return h(
    'div',
    { className: 'tl-explained', 'data-explained': x.kind, 'data-id': x.id },
    h('h4', null, title),
    x.collectives.length === 0
      ? h('div', { className: 'tl-empty' }, 'None: under this plan nothing is moved here.')
      : x.collectives.map(c => collectiveCard(c, view, host))
  );
}

function collectiveCard(c: CollectiveView, view: ViewModel, host: Host): HTMLElement {
  const colorOf = new Map(view.classes.map(k => [k.name, k.color]));
  const est = view.estimate;
  const count = c.count === 1 ? '' : ` ×${round(c.count)}`;
  const layers = c.layers > 1 ? ` (${c.layers} layers)` : '';
  return h(
    'div',
    { className: 'tl-collective', 'data-kind': c.kind, 'data-op': c.op },
    h(
      'div',
      { className: 'tl-collective-head' },
      h('span', { className: 'tl-collective-label' }, `${c.label}${count}`),
      h('span', { className: 'tl-collective-cost' }, `${fmt.bytes(c.bytes)} · ${fmt.seconds(c.time_s)} per step${layers}`)
    ),
    row('asked by', c.classes.length ? c.classes.map(n => chip(colorOf.get(n) ?? '#9AA0A6', n)) : 'no class of its own'),
    row('at', h('span', null, `${c.primitive} (op ${c.op})`, c.scope ? h('span', { className: 'tl-muted' }, ` in ${c.scope}`) : null)),
    row('source', h('span', { className: 'tl-mono tl-source-line' }, c.source || 'unknown')),
    row('moves', c.operand === null ? `partial results: ${c.tensor}` : `operand ${c.operand}: ${c.tensor}`),
    h('div', { className: 'tl-collective-why' }, c.why),
    c.patterns.length ? row('decided by', c.patterns.join(', ')) : null,
    c.remedy
      ? h(
          'div',
          { className: 'tl-remedy' },
          h('span', { className: 'tl-k' }, 'removed by'),
          h(
            'button',
            {
              className: 'tl-choice tl-remedy-choice',
              disabled: !host.interactive,
              'data-name': c.remedy.name,
              title: host.interactive ? `Pin ${c.remedy.label}` : 'Read-only: open this plan in a Lab to change it',
              onclick: (() => host.send({ event: 'pin', name: c.remedy!.name, value: c.remedy!.value })) as EventListener
            },
            h('span', { className: 'tl-choice-label' }, c.remedy.label),
            h(
              'span',
              { className: 'tl-choice-cost' },
              fmt.seconds(c.remedy.step_time_s),
              est ? h('span', { className: `tl-delta ${sign(c.remedy.step_time_s - est.step_time_s)}` }, fmt.delta(c.remedy.step_time_s - est.step_time_s, fmt.seconds)) : null,
              ' · ',
              fmt.bytes(c.remedy.peak_memory_bytes),
              est ? h('span', { className: `tl-delta ${sign(c.remedy.peak_memory_bytes - est.peak_memory_bytes)}` }, fmt.delta(c.remedy.peak_memory_bytes - est.peak_memory_bytes, fmt.bytes)) : null
            )
          )
        )
      : h('div', { className: 'tl-remedy tl-muted' }, 'No single choice tried removes it.')
  );
}

function row(k: string, v: Node | string | (Node | string)[]): HTMLElement {
  return h('div', { className: 'tl-kv' }, h('span', { className: 'tl-k' }, k), h('span', { className: 'tl-v' }, v));
}

function round(x: number): string {
  return Number.isInteger(x) ? String(x) : x.toFixed(1);
}

function sign(d: number): string {
  if (Math.abs(d) < fmt.NEGLIGIBLE) {
    return '';
  }
  return d < 0 ? 'tl-better' : 'tl-worse';
}

// Device grids --------------------------------------------------------------------------------

/** Where each tensor's blocks live: one grid per tensor, a cell per device. */
export function meshGrids(tensors: [string, TensorView][], mesh: Record<string, number>): HTMLElement | null {
  const shown = tensors.filter(([, t]) => t.dim_axes !== undefined);
  if (shown.length === 0) {
    return null;
  }
  return h(
    'div',
    { className: 'tl-grids' },
    h('h4', null, 'Over the devices'),
    h('div', { className: 'tl-section-note' }, deviceNote(mesh)),
    h('div', { className: 'tl-grid-list' }, shown.map(([role, t]) => deviceGrid(role, t, mesh)))
  );
}

/** How the grid lays the mesh out: its first axes down, the others across. */
function deviceNote(mesh: Record<string, number>): string {
  const [down, across] = split(Object.keys(mesh));
  const words = (axes: string[]) => (axes.length ? axes.map(a => `${a} (${mesh[a]})`).join(' × ') : 'one');
  return `A cell per device: rows ${words(down)}, columns ${words(across)}. A cell shows the block it holds of each sharded dim; cells of one colour hold the same data.`;
}

function split(axes: string[]): [string[], string[]] {
  const k = Math.ceil(axes.length / 2);
  return axes.length === 1 ? [[], axes] : [axes.slice(0, k), axes.slice(k)];
}

/** A device's block of tensor `t`: per dim, (block index, blocks) — (0, 1) where whole. */
export function blockOf(t: TensorView, coords: Record<string, number>, mesh: Record<string, number>): [number, number][] {
  return (t.dim_axes ?? []).map(axes => {
    let index = 0;
    let blocks = 1;
    for (const a of axes) {
      index = index * mesh[a] + (coords[a] ?? 0);
      blocks *= mesh[a];
    }
    return [index, blocks];
  });
}

function deviceGrid(role: string, t: TensorView, mesh: Record<string, number>): HTMLElement {
  const names = Object.keys(mesh);
  const [down, across] = split(names);
  const rows = down.reduce((n, a) => n * mesh[a], 1);
  const cols = across.reduce((n, a) => n * mesh[a], 1);
  const sharded = (t.dim_axes ?? []).map((axes, d) => [axes, d] as [string[], number]).filter(([axes]) => axes.length > 0);
  const totalBlocks = sharded.reduce((n, [axes]) => n * axes.reduce((m, a) => m * mesh[a], 1), 1);
  const table = h('table', { className: 'tl-grid', 'data-value': t.value });
  for (let r = 0; r < rows; r++) {
    const tr = h('tr');
    for (let c = 0; c < cols; c++) {
      const coords = { ...unflatten(r, down, mesh), ...unflatten(c, across, mesh) };
      const device = names.reduce((n, a) => n * mesh[a] + coords[a], 0);
      const blocks = blockOf(t, coords, mesh);
      const label = sharded.map(([, d]) => String(blocks[d][0])).join('·');
      let id = 0;
      for (const [, d] of sharded) {
        id = id * blocks[d][1] + blocks[d][0];
      }
      const hue = totalBlocks > 1 ? Math.round((360 * id) / totalBlocks) : 0;
      tr.appendChild(
        h(
          'td',
          {
            'data-device': device,
            style: totalBlocks > 1 ? `background:hsl(${hue} 55% 85%)` : 'background:var(--tl-bg2)',
            title: `device ${device} (${names.map(a => `${a}=${coords[a]}`).join(', ')}) holds ${slices(t, blocks)}`
          },
          label || '·'
        )
      );
    }
    table.appendChild(tr);
  }
  return h(
    'div',
    { className: 'tl-grid-box' },
    h('div', { className: 'tl-grid-title tl-mono', title: t.spec }, `${role} %${t.value} ${t.spec}`),
    table
  );
}

function unflatten(i: number, axes: string[], mesh: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (let k = axes.length - 1; k >= 0; k--) {
    out[axes[k]] = i % mesh[axes[k]];
    i = Math.floor(i / mesh[axes[k]]);
  }
  return out;
}

/** "[16:24, :, 32:64]": the part of `t` a device holds. */
function slices(t: TensorView, blocks: [number, number][]): string {
  const parts = t.shape.map((n, d) => {
    const [i, k] = blocks[d] ?? [0, 1];
    return k === 1 ? ':' : `${(i * n) / k}:${((i + 1) * n) / k}`;
  });
  return `[${parts.join(', ')}] of ${t.dtype}[${t.shape.join(',')}]`;
}
