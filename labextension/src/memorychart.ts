/**
 * The memory chart: live bytes per device over the step, stacked by category, drawn with
 * BokehJS from the view model's `memory` (MemoryView), with the device's capacity as a line
 * and the peak marked, labelled and clickable. One chart per Lab view, drawn again only when
 * what it shows changes (a new plan), never per search update.
 */
import { h, fill } from './dom';
import * as fmt from './format';
import { BokehPlotting, loadBokehPlotting } from './bokeh';
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

/** What the chart is drawn from: the memory of the step, the device memory, and the size. */
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

/** The last path parts of a source line, "_gpt.py:61" from ".../zoo/_gpt.py:61:9 (fn)". */
export function shortSource(source: string): string {
  const where = source.split(' (')[0];
  const file = where.split('/').pop() ?? where;
  const [name, line] = file.split(':');
  return line ? `${name}:${line}` : name;
}

export class MemoryChart {
  /** Holds the chart; moved between panels as tabs change, drawn again only on new input. */
  readonly node = h('div', { className: 'tl-memory-chart' });
  private key = '';
  /** The plot's view in the page (what BokehJS drew), to be removed before a redraw. */
  private drawn: { remove(): void; frame: { x_scale: { compute(x: number): number } } } | null = null;
  private bokeh: BokehPlotting | null = null;
  private document: unknown = null;

  /** `pick` is told of the op a click on the chart picks (the peak near its marker). */
  constructor(private pick: (point: MemoryPoint) => void) {}

  /** Draws `input` unless it is what is drawn. Resolves once drawn (or says why not). */
  async draw(input: MemoryChartInput): Promise<void> {
    const key = JSON.stringify([input.memory.positions.length, input.memory.peak_position, input.memory.peak_bytes, input.capacity, input.memory.categories]);
    if (key === this.key) {
      return;
    }
    this.key = key;
    this.remove();
    fill(this.node, h('div', { className: 'tl-muted tl-memory-wait' }, 'drawing the chart…'));
    let bokeh: BokehPlotting;
    try {
      bokeh = await loadBokehPlotting();
    } catch (err) {
      this.key = ''; // a later update tries again
      fill(this.node, h('div', { className: 'tl-empty', role: 'alert' }, `The chart could not be drawn: ${err}.`));
      return;
    }
    if (key !== this.key) {
      return; // newer input arrived while BokehJS loaded
    }
    const plot = this.figure(bokeh, input);
    const target = h('div', { className: 'tl-memory-plot' });
    fill(this.node, target);
    this.bokeh = bokeh;
    const drawn = await bokeh.Plotting.show(plot, target);
    if (key !== this.key) {
      drawn.remove(); // newer input arrived while it drew: its own draw replaces this one
      dropDocument(bokeh, plot.document);
      return;
    }
    this.drawn = drawn;
    this.document = plot.document;
  }

  dispose(): void {
    this.remove();
    this.key = '';
  }

  private remove(): void {
    this.drawn?.remove();
    this.drawn = null;
    if (this.bokeh) {
      dropDocument(this.bokeh, this.document);
    }
    this.document = null;
  }

  private figure(B: BokehPlotting, { memory: m, capacity }: MemoryChartInput) {
    const names = Object.keys(m.categories);
    const n = m.positions.length;
    const k = Math.max(0, m.positions.indexOf(m.peak_position));
    const peak = m.peak_bytes;
    const fits = capacity === null || peak <= capacity;
    const capacityShown = capacity !== null && capacity > 0 && capacity <= CAPACITY_IN_VIEW * peak;
    const unit = axisUnit(Math.max(peak, capacityShown ? capacity! : 0));
    const top = Math.max(peak, capacityShown ? capacity! : 0) / unit.scale;
    // The last op holds its bytes for one position: the step drawn to its end.
    const xs = [...m.positions, m.steps];
    const data: Record<string, number[]> = { x: xs };
    let below = new Array<number>(n + 1).fill(0);
    names.forEach((c, j) => {
      const values = m.categories[c];
      const above = below.map((b, i) => b + values[Math.min(i, n - 1)] / unit.scale);
      data[`lo${j}`] = below;
      data[`hi${j}`] = above;
      below = above;
    });
    data.total = below;
    const source = new B.ColumnDataSource({ data });
    const fig = B.Plotting.figure({
      name: MEMORY_PLOT,
      height: 250,
      sizing_mode: 'stretch_width',
      toolbar_location: null,
      tools: [],
      x_range: new B.Range1d({ start: 0, end: Math.max(1, m.steps) }),
      y_range: new B.Range1d({ start: 0, end: top * HEADROOM || 1 }),
      x_axis_label: 'ops, in the order they run',
      y_axis_label: `${unit.name} per device`,
      background_fill_color: '#fbfbfb',
      min_border_left: 8,
      min_border_right: 14,
      outline_line_color: null
    });
    fig.xaxis.ticker = new B.BasicTicker({ desired_num_ticks: 5 });
    fig.yaxis.ticker = new B.BasicTicker({ desired_num_ticks: 5 });
    fig.xaxis.axis_label_text_font_size = '11px';
    fig.yaxis.axis_label_text_font_size = '11px';
    fig.xaxis.major_label_text_font_size = '11px';
    fig.yaxis.major_label_text_font_size = '11px';
    fig.xaxis.axis_label_text_font_style = 'normal';
    fig.yaxis.axis_label_text_font_style = 'normal';
    fig.xgrid.grid_line_color = null;
    const areas = names.map((_, j) =>
      fig.varea_step({
        x: { field: 'x' },
        y1: { field: `lo${j}` },
        y2: { field: `hi${j}` },
        step_mode: 'after',
        source,
        fill_color: MEMORY_COLORS[j % MEMORY_COLORS.length],
        fill_alpha: 0.85
      })
    );
    fig.step({ x: { field: 'x' }, y: { field: 'total' }, mode: 'after', source, line_color: INK, line_width: 1 });
    // Hover: what is live at the position under the pointer.
    fig.add_tools(
      new B.HoverTool({
        renderers: areas,
        mode: 'mouse',
        tooltips: (_source: unknown, vars: { index: number | null }) => this.tooltip(m, names, vars.index ?? 0)
      })
    );
    // The capacity: a line when it is near enough to read the chart under it, else named.
    if (capacity !== null && capacity > 0) {
      const color = fits ? INK : BAD;
      if (capacityShown) {
        fig.add_layout(new B.Span({ location: capacity / unit.scale, dimension: 'width', line_color: color, line_width: 2, line_dash: 'dashed' }));
      }
      fig.add_layout(
        new B.Label({
          x: m.steps,
          y: capacityShown ? capacity / unit.scale : top * HEADROOM,
          x_units: 'data',
          y_units: 'data',
          text: capacityShown ? `capacity ${fmt.bytes(capacity)}` : `capacity ${fmt.bytes(capacity)} ↑ (above the chart)`,
          text_align: 'right',
          text_baseline: capacityShown ? 'bottom' : 'top',
          x_offset: -4,
          y_offset: capacityShown ? 2 : -2,
          text_font_size: '11px',
          text_color: color,
          background_fill_color: '#fbfbfb',
          background_fill_alpha: 0.85
        })
      );
    }
    // The peak: marked, labelled with its bytes and its op, and picked by a click near it.
    if (n > 0) {
      const px = m.peak_position + 0.5;
      const py = peak / unit.scale;
      fig.add_layout(new B.Span({ location: px, dimension: 'height', line_color: fits ? INK : BAD, line_width: 1, line_dash: 'dotted' }));
      fig.scatter({ x: [px], y: [py], marker: 'inverted_triangle', size: 14, fill_color: fits ? INK : BAD, line_color: 'white', line_width: 1.5 });
      const right = m.peak_position > 0.6 * m.steps;
      // Above the marker, or beside it when the peak is near the top of the plot.
      const high = py > 0.72 * top * HEADROOM;
      fig.add_layout(
        new B.Label({
          x: px,
          y: py,
          text: `peak ${fmt.bytes(peak)}\n${m.peak_primitive || 'op'} (op ${m.peak_op})${m.peak_source ? ` · ${shortSource(m.peak_source)}` : ''}`,
          text_align: right ? 'right' : 'left',
          text_baseline: high ? 'top' : 'bottom',
          x_offset: right ? -12 : 12,
          y_offset: high ? -2 : 8,
          text_font_size: '11px',
          text_color: fits ? INK : BAD,
          background_fill_color: 'white',
          background_fill_alpha: 0.85,
          padding: 2
        })
      );
      fig.on_event('tap', (e: { x: number; sx: number }) => {
        const peakSx = this.drawn?.frame.x_scale.compute(px) ?? Infinity;
        const i = Math.abs(e.sx - peakSx) <= PEAK_PX ? k : nearest(m.positions, e.x);
        this.pick({ op: m.ops[i], position: m.positions[i], bytes: Object.fromEntries(names.map(c => [c, m.categories[c][i]])) });
      });
    }
    return fig;
  }

  /** What is live at a position, for the hover tooltip (drawn inside BokehJS's shadow DOM,
   * where the page's style sheets do not reach: styled inline). */
  private tooltip(m: MemoryView, names: string[], index: number): HTMLElement {
    const i = Math.min(index, m.positions.length - 1);
    const total = names.reduce((a, c) => a + m.categories[c][i], 0);
    const peak = m.positions[i] === m.peak_position;
    const swatch = (color: string) =>
      h('span', { style: `display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px;vertical-align:-1px;background:${color}` });
    return h(
      'div',
      { className: 'tl-memory-tip', style: 'font-size:11.5px;line-height:1.45;max-width:300px' },
      h('div', null, h('b', null, fmt.bytes(total)), ` live${peak ? ' (the peak)' : ''}`),
      h('div', { style: 'color:#666' }, `op ${m.ops[i]}, run ${(m.positions[i] + 1).toLocaleString()} of ${m.steps.toLocaleString()}`),
      names.map((c, j) => (m.categories[c][i] ? h('div', null, swatch(MEMORY_COLORS[j % MEMORY_COLORS.length]), `${c} ${fmt.bytes(m.categories[c][i])}`) : null))
    );
  }
}

/** Forgets a chart's document: BokehJS keeps every document it has shown in `documents`. */
function dropDocument(bokeh: BokehPlotting, doc: unknown): void {
  const docs = bokeh.documents as unknown[];
  const i = doc === null ? -1 : docs.indexOf(doc);
  if (i >= 0) {
    docs.splice(i, 1);
  }
}

/** The index of the position drawn nearest to `x` (positions ascending; a step covers
 * [position, next position)). */
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
