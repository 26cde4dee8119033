/**
 * The memory chart: live bytes per device over the step, stacked by category, drawn with
 * BokehJS from the view model's `memory` (MemoryView), with the device's capacity as a line
 * and the peak marked, labelled and clickable; under it, its legend, which reads each
 * category's bytes at the peak, or at the op under the pointer. One chart per Lab view, drawn
 * again only when what it shows changes (a new plan), never per search update.
 */
import { h, fill } from './dom';
import * as fmt from './format';
import { BokehPlotting, DrawnPlot, PlotSlot } from './bokeh';
import { MemoryView } from './viewmodel';

/** Okabe–Ito, the bottom of the stack first (as the Estimate tab's memory bar). */
export const MEMORY_COLORS = ['#0072B2', '#E69F00', '#009E73', '#CC79A7', '#56B4E9'];
const BAD = '#C62828';
const INK = '#222222';
/** The name of the chart's plot in BokehJS's documents (tests read the chart back by it). */
export const MEMORY_PLOT = 'toast-lab-memory-timeline';
/** A click this close to the peak marker (px) picks the peak. */
const PEAK_PX = 10;
/** Up to this many times the peak, the capacity is a line across the chart (the stack then
 * fills at least a fifth of its height); above, it would flatten the stack and is named at the
 * top instead. */
const CAPACITY_IN_VIEW = 5;
/** The y axis reaches this far above the highest of the peak and the capacity line. */
const HEADROOM = 1.18;

/** What the chart is drawn from: the memory of the step and the device's memory (bytes). */
export interface MemoryChartInput {
  memory: MemoryView;
  capacity: number | null;
}

/** An op of the step, as a click on the chart gives it. */
export interface MemoryPoint {
  op: number;
  /** Its position in the step (0: the first op run). */
  position: number;
  /** Bytes live there, per category. */
  bytes: Record<string, number>;
}

/** Bytes in the unit the chart's axis reads: GiB, MiB or KiB, by the largest value. */
export function axisUnit(largest: number): { name: string; scale: number } {
  for (const [name, scale] of [['GiB', 2 ** 30], ['MiB', 2 ** 20], ['KiB', 2 ** 10]] as [string, number][]) {
    if (largest >= scale) {
      return { name, scale };
    }
  }
  return { name: 'bytes', scale: 1 };
}

/** The file and line of a source line, "_gpt.py:61" from ".../zoo/_gpt.py:61:9 (fn)". */
export function shortSource(source: string): string {
  const where = source.split(' (')[0];
  const file = where.split('/').pop() ?? where;
  const [name, line] = file.split(':');
  return line ? `${name}:${line}` : name;
}

/** The op drawn at index `i` of `m`, with its bytes. */
export function pointAt(m: MemoryView, i: number): MemoryPoint {
  return { op: m.ops[i], position: m.positions[i], bytes: Object.fromEntries(Object.entries(m.categories).map(([c, v]) => [c, v[i]])) };
}

/** The index of the position drawn at `x` (positions ascending; each holds until the next). */
export function nearest(positions: number[], x: number): number {
  let lo = 0;
  let hi = positions.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (positions[mid] <= x) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

type Figure = ReturnType<BokehPlotting['Plotting']['figure']>;

/** The plot's view in the page: what BokehJS drew (removed before a redraw). */
interface PlotView extends DrawnPlot {
  frame: { x_scale: { compute(x: number): number } };
}

export class MemoryChart {
  /** Holds the chart and its legend; moved between panels as tabs change. */
  readonly node = h('div', { className: 'tl-memory-chart' });
  private slot = new PlotSlot<PlotView>();
  private legend = h('div', { className: 'tl-bar-legend tl-memory-legend' });
  private input: MemoryChartInput | null = null;

  /** `pick` is told of the op a click on the chart picks (the peak near its marker). */
  constructor(private pick: (point: MemoryPoint) => void) {}

  /** Draws `input` unless it is what is drawn. Resolves once drawn (or says why not). */
  async draw(input: MemoryChartInput): Promise<void> {
    const m = input.memory;
    const key = JSON.stringify([m.positions.length, m.peak_position, m.peak_bytes, input.capacity, m.categories]);
    if (!this.slot.claim(key)) {
      return;
    }
    this.input = input;
    const target = h('div', { className: 'tl-memory-plot' }, h('div', { className: 'tl-muted tl-memory-wait' }, 'drawing the chart…'));
    fill(this.node, target, this.legend);
    this.readAt(null);
    await this.slot.show(key, target, 'chart', (bokeh) => this.figure(bokeh, input));
  }

  dispose(): void {
    this.slot.dispose();
  }

  /** The legend reads the bytes of each category at index `i` of the drawn positions (null:
   * at the peak). */
  private readAt(i: number | null): void {
    const input = this.input;
    if (!input) {
      return;
    }
    const m = input.memory;
    const k = i ?? m.positions.indexOf(m.peak_position);
    const p = pointAt(m, k);
    const total = Object.values(p.bytes).reduce((a, b) => a + b, 0);
    const peak = p.position === m.peak_position;
    const where = i === null ? 'at the peak' : `at run ${(p.position + 1).toLocaleString()}, op ${p.op}${peak ? ' (the peak)' : ''}`;
    this.legend.dataset.position = String(p.position);
    fill(
      this.legend,
      h('span', { className: 'tl-memory-readout' }, h('b', null, fmt.bytes(total)), ` live ${where}:`),
      Object.entries(p.bytes).map(([c, b], j) =>
        h('span', { 'data-category': c }, h('span', { className: 'tl-swatch', style: `background:${MEMORY_COLORS[j % MEMORY_COLORS.length]}` }), `${c} ${fmt.bytes(b)}`)
      ),
      input.capacity === null
        ? null
        : capacityDrawn(m, input.capacity)
          ? h('span', null, h('span', { className: 'tl-capacity-line-key' }), `capacity ${fmt.bytes(input.capacity)}`)
          : h('span', null, `capacity ${fmt.bytes(input.capacity)}, above the chart`)
    );
  }

  private figure(B: BokehPlotting, { memory: m, capacity }: MemoryChartInput) {
    const peak = m.peak_bytes;
    const capacityShown = capacity !== null && capacityDrawn(m, capacity);
    const unit = axisUnit(Math.max(peak, capacityShown ? capacity! : 0));
    const top = (Math.max(peak, capacityShown ? capacity! : 0) / unit.scale) * HEADROOM || 1;
    const fig = B.Plotting.figure({
      name: MEMORY_PLOT,
      height: 250,
      sizing_mode: 'stretch_width',
      toolbar_location: null,
      tools: [],
      x_range: new B.Range1d({ start: 0, end: Math.max(1, m.steps) }),
      y_range: new B.Range1d({ start: 0, end: top }),
      x_axis_label: 'ops, in the order they run',
      y_axis_label: `${unit.name} per device`,
      background_fill_color: '#fbfbfb',
      min_border_left: 8,
      min_border_right: 14,
      outline_line_color: null
    });
    for (const axis of [fig.xaxis, fig.yaxis]) {
      axis.axis_label_text_font_size = '11px';
      axis.major_label_text_font_size = '11px';
      axis.axis_label_text_font_style = 'normal';
    }
    fig.xaxis.ticker = new B.BasicTicker({ desired_num_ticks: 5 });
    fig.yaxis.ticker = new B.BasicTicker({ desired_num_ticks: 5 });
    fig.xgrid.grid_line_color = null;
    this.stack(B, fig, m, unit.scale);
    if (capacity !== null && capacity > 0) {
      this.capacity(B, fig, m, capacity, capacityShown ? capacity / unit.scale : null, top);
    }
    if (m.positions.length > 0) {
      this.peak(B, fig, m, peak / unit.scale, top, capacity === null || peak <= capacity);
    }
    return fig;
  }

  /** The categories as stacked steps (each op's bytes hold until the next op drawn), the
   * total as a line over them, and a cursor line that follows the pointer while the legend
   * reads what is live there. */
  private stack(B: BokehPlotting, fig: Figure, m: MemoryView, scale: number): void {
    const n = m.positions.length;
    const names = Object.keys(m.categories);
    const data: Record<string, number[]> = { x: [...m.positions, m.steps] };
    let below = new Array<number>(n + 1).fill(0);
    names.forEach((c, j) => {
      const above = below.map((b, i) => b + m.categories[c][Math.min(i, n - 1)] / scale);
      data[`lo${j}`] = below;
      data[`hi${j}`] = above;
      below = above;
    });
    data.total = below;
    const source = new B.ColumnDataSource({ data });
    names.forEach((_, j) =>
      fig.varea_step({ x: { field: 'x' }, y1: { field: `lo${j}` }, y2: { field: `hi${j}` }, step_mode: 'after', source, fill_color: MEMORY_COLORS[j % MEMORY_COLORS.length], fill_alpha: 0.85 })
    );
    fig.step({ x: { field: 'x' }, y: { field: 'total' }, mode: 'after', source, line_color: INK, line_width: 1 });
    const cursor = new B.Span({ dimension: 'height', line_color: '#888888', line_width: 1, visible: false });
    fig.add_layout(cursor);
    fig.on_event('mousemove', (e: { x: number }) => {
      if (n > 0 && e.x >= 0 && e.x <= m.steps) {
        cursor.location = e.x;
        cursor.visible = true;
        this.readAt(nearest(m.positions, e.x));
      }
    });
    fig.on_event('mouseleave', () => {
      cursor.visible = false;
      this.readAt(null);
    });
  }

  /** The device's memory: a dashed line with its name, or its name at the top when it is too
   * far above the peak to draw (`at` null). */
  private capacity(B: BokehPlotting, fig: Figure, m: MemoryView, capacity: number, at: number | null, top: number): void {
    const color = m.peak_bytes <= capacity ? INK : BAD;
    if (at !== null) {
      fig.add_layout(new B.Span({ location: at, dimension: 'width', line_color: color, line_width: 2, line_dash: 'dashed' }));
    }
    fig.add_layout(
      new B.Label({
        x: m.steps,
        y: at ?? top,
        text: at !== null ? `capacity ${fmt.bytes(capacity)}` : `capacity ${fmt.bytes(capacity)} ↑ (above the chart)`,
        text_align: 'right',
        text_baseline: at !== null ? 'bottom' : 'top',
        x_offset: -4,
        y_offset: at !== null ? 2 : -2,
        text_font_size: '11px',
        text_color: color,
        background_fill_color: '#fbfbfb',
        background_fill_alpha: 0.85
      })
    );
  }

  /** The peak: a marker labelled with its bytes, op and source line; a click near it picks
   * the peak's op, a click elsewhere the op drawn there. */
  private peak(B: BokehPlotting, fig: Figure, m: MemoryView, py: number, top: number, fits: boolean): void {
    const px = m.peak_position + 0.5;
    const color = fits ? INK : BAD;
    fig.add_layout(new B.Span({ location: px, dimension: 'height', line_color: color, line_width: 1, line_dash: 'dotted' }));
    fig.scatter({ x: [px], y: [py], marker: 'inverted_triangle', size: 14, fill_color: color, line_color: 'white', line_width: 1.5 });
    // Short lines on the wider side of the marker: they fit a plot as narrow as the side panel.
    const right = m.peak_position > 0.5 * m.steps;
    const high = py > 0.62 * top; // beside the marker, not above it, near the top of the plot
    const lines = [`peak ${fmt.bytes(m.peak_bytes)}`, `${m.peak_primitive || 'op'} (op ${m.peak_op})`];
    if (m.peak_source) {
      lines.push(shortSource(m.peak_source));
    }
    fig.add_layout(
      new B.Label({
        x: px,
        y: py,
        text: lines.join('\n'),
        text_align: right ? 'right' : 'left',
        text_baseline: high ? 'top' : 'bottom',
        x_offset: right ? -12 : 12,
        y_offset: high ? -2 : 8,
        text_font_size: '11px',
        text_color: color,
        background_fill_color: 'white',
        background_fill_alpha: 0.85,
        padding: 2
      })
    );
    const k = m.positions.indexOf(m.peak_position);
    fig.on_event('tap', (e: { x: number; sx: number }) => {
      const peakSx = this.slot.view?.frame.x_scale.compute(px) ?? Infinity;
      this.pick(pointAt(m, Math.abs(e.sx - peakSx) <= PEAK_PX ? k : nearest(m.positions, e.x)));
    });
  }
}

/** Whether the capacity is drawn as a line (near enough the peak not to flatten the stack). */
function capacityDrawn(m: MemoryView, capacity: number): boolean {
  return capacity > 0 && capacity <= CAPACITY_IN_VIEW * m.peak_bytes;
}
