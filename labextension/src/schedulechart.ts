/**
 * The pipeline schedule chart: micro-batches over ticks, one row per stage, drawn with
 * BokehJS from the view model's `schedule` (ScheduleView). The forward loop's ticks, then the
 * backward loop's, each cell the micro-batch a stage runs there (and which of its runs of
 * layers, in a circular schedule); the cells where a stage has
 * none are hatched: the bubble. Around it, in words: the bubble's share of each stage's ticks
 * and one hand-off between stages (the estimate's collective-permute over the stage axis).
 * Drawn again only when the schedule changes (a new pin), as the memory chart is.
 */
import { h, fill } from './dom';
import * as fmt from './format';
import { BokehPlotting, PlotSlot } from './bokeh';
import { ScheduleView } from './viewmodel';

/** Okabe–Ito blue and orange: the forward and the backward of a micro-batch. */
export const FORWARD = '#0072B2';
export const BACKWARD = '#E69F00';
const IDLE_FILL = '#F1F1F1';
const IDLE_HATCH = '#B5B5B5';
const INK = '#222222';
/** The name of the chart's plot in BokehJS's documents (tests read the chart back by it). */
export const SCHEDULE_PLOT = 'toast-lab-pipeline-schedule';
/** Columns between the two loops. */
const GAP = 0.7;
/** Up to this many cells per row, each cell is labelled with its micro-batch ("F2"; fewer for
 * a circular schedule's longer "F2.1"). */
const LABELLED_COLUMNS = 36;
const LABELLED_COLUMNS_CIRCULAR = 26;

/** The x of tick `t` of the forward (`backward` false) or backward loop. */
export function tickX(s: ScheduleView, t: number, backward: boolean): number {
  return backward ? s.ticks + GAP + t : t;
}

/** The layers stage `stage` holds, "layers 2–3"; circular, one range per run: "layers 1, 3". */
export function stageLayers(s: ScheduleView, stage: number): string {
  const runs = s.chunks ?? 1;
  const each = Math.floor(s.layers / (s.stages * runs));
  const spans = Array.from({ length: runs }, (_, r) => {
    const lo = (r * s.stages + stage) * each;
    return each > 1 ? `${lo}–${lo + each - 1}` : `${lo}`;
  });
  return `${runs > 1 || each > 1 ? 'layers' : 'layer'} ${spans.join(', ')}`;
}

/** A work item in a cell: "F2" (forward of micro-batch 2), "B2.1" (its backward in run 1). */
export function cellText(s: ScheduleView, item: number, backward: boolean): string {
  const m = item % s.micro_batches;
  const run = Math.floor(item / s.micro_batches);
  return `${backward ? 'B' : 'F'}${m}${(s.chunks ?? 1) > 1 ? `.${run}` : ''}`;
}

export class ScheduleChart {
  /** Holds the chart; moved between panels as tabs change. */
  readonly node = h('div', { className: 'tl-schedule-chart' });
  private slot = new PlotSlot();

  /** Draws `schedule` unless it is what is drawn. Resolves once drawn (or says why not). */
  async draw(schedule: ScheduleView): Promise<void> {
    const key = JSON.stringify([schedule.forward, schedule.backward, schedule.layers, schedule.chunks]);
    if (!this.slot.claim(key)) {
      return;
    }
    const target = h('div', { className: 'tl-schedule-plot' }, h('div', { className: 'tl-muted tl-memory-wait' }, 'drawing the schedule…'));
    fill(this.node, target);
    await this.slot.show(key, target, 'schedule', (bokeh) => this.figure(bokeh, schedule));
  }

  dispose(): void {
    this.slot.dispose();
  }

  private figure(B: BokehPlotting, s: ScheduleView) {
    const rowPx = Math.max(20, Math.min(30, Math.floor(300 / s.stages)));
    const right = tickX(s, s.ticks - 1, true) + 0.5;
    const fig = B.Plotting.figure({
      name: SCHEDULE_PLOT,
      height: 58 + rowPx * (s.stages + 1),
      sizing_mode: 'stretch_width',
      toolbar_location: null,
      tools: [],
      x_range: new B.Range1d({ start: -0.5, end: right }),
      // stage 0 on top; a row above the stages for the loops' names
      y_range: new B.Range1d({ start: s.stages - 0.5, end: -1.4 }),
      x_axis_label: 'ticks of each loop',
      background_fill_color: '#ffffff',
      min_border_left: 8,
      min_border_right: 10,
      outline_line_color: null
    });
    for (const axis of [fig.xaxis, fig.yaxis]) {
      axis.axis_label_text_font_size = '11px';
      axis.major_label_text_font_size = '11px';
      axis.axis_label_text_font_style = 'normal';
      axis.major_tick_line_color = null;
      axis.minor_tick_line_color = null;
    }
    fig.xgrid.grid_line_color = null;
    fig.ygrid.grid_line_color = null;
    const stages = Array.from({ length: s.stages }, (_, i) => i);
    fig.yaxis.ticker = new B.FixedTicker({ ticks: stages });
    fig.yaxis.major_label_overrides = new Map(stages.map(i => [i, `stage ${i} · ${stageLayers(s, i)}`]));
    const every = Math.max(1, Math.ceil(s.ticks / 6));
    const ticks: number[] = [];
    const labels = new Map<number, string>();
    for (const backward of [false, true]) {
      for (let t = 0; t < s.ticks; t += every) {
        ticks.push(tickX(s, t, backward));
        labels.set(tickX(s, t, backward), String(t + 1));
      }
    }
    fig.xaxis.ticker = new B.FixedTicker({ ticks });
    fig.xaxis.major_label_overrides = labels;
    this.cells(B, fig, s);
    for (const backward of [false, true]) {
      fig.add_layout(
        new B.Label({
          x: (tickX(s, 0, backward) + tickX(s, s.ticks - 1, backward)) / 2,
          y: -0.95,
          text: backward ? 'backward loop' : 'forward loop',
          text_align: 'center',
          text_baseline: 'middle',
          text_font_size: '11px',
          text_color: INK
        })
      );
    }
    fig.add_layout(new B.Span({ location: s.ticks - 0.5 + GAP / 2, dimension: 'height', line_color: '#888888', line_width: 1, line_dash: 'dotted' }));
    return fig;
  }

  /** The cells: a rect per stage and tick, coloured by loop, hatched where the stage idles,
   * labelled with the micro-batch where the cells are wide enough to read. */
  private cells(B: BokehPlotting, fig: ReturnType<BokehPlotting['Plotting']['figure']>, s: ScheduleView): void {
    const runs = { x: [] as number[], y: [] as number[], color: [] as string[], text: [] as string[], ink: [] as string[], what: [] as string[] };
    const idle = { x: [] as number[], y: [] as number[], what: [] as string[] };
    for (const backward of [false, true]) {
      const grid = backward ? s.backward : s.forward;
      const loop = backward ? 'backward' : 'forward';
      grid.forEach((row, stage) =>
        row.forEach((item, t) => {
          const x = tickX(s, t, backward);
          if (item < 0) {
            idle.x.push(x);
            idle.y.push(stage);
            idle.what.push(`stage ${stage}, ${loop} tick ${t + 1}: idle (the bubble)`);
            return;
          }
          runs.x.push(x);
          runs.y.push(stage);
          runs.color.push(backward ? BACKWARD : FORWARD);
          runs.ink.push(backward ? INK : '#ffffff');
          const m = item % s.micro_batches;
          const run = (s.chunks ?? 1) > 1 ? ` in its run ${Math.floor(item / s.micro_batches)}` : '';
          runs.text.push(cellText(s, item, backward));
          runs.what.push(`stage ${stage}, ${loop} tick ${t + 1}: the ${loop} of micro-batch ${m}${run}`);
        })
      );
    }
    const idleSource = new B.ColumnDataSource({ data: idle });
    const runSource = new B.ColumnDataSource({ data: runs });
    const idleCells = fig.rect({
      x: { field: 'x' }, y: { field: 'y' }, width: 0.92, height: 0.84, source: idleSource,
      fill_color: IDLE_FILL, line_color: IDLE_HATCH, line_width: 1, hatch_pattern: '/', hatch_color: IDLE_HATCH, hatch_scale: 8
    });
    const runCells = fig.rect({
      x: { field: 'x' }, y: { field: 'y' }, width: 0.92, height: 0.84, source: runSource,
      fill_color: { field: 'color' }, line_color: null
    });
    if (2 * s.ticks <= ((s.chunks ?? 1) > 1 ? LABELLED_COLUMNS_CIRCULAR : LABELLED_COLUMNS)) {
      fig.text({
        x: { field: 'x' }, y: { field: 'y' }, text: { field: 'text' }, source: runSource,
        text_color: { field: 'ink' }, text_align: 'center', text_baseline: 'middle', text_font_size: '10px'
      });
    }
    fig.add_tools(new B.HoverTool({ renderers: [runCells, idleCells], tooltips: '@what' }));
  }
}

/** The schedule in words and as a chart: what the Decisions tab shows under the stages. */
export function schedulePanel(s: ScheduleView, chart: ScheduleChart): HTMLElement {
  void chart.draw(s);
  const idle = s.stages - 1;
  const handoff =
    s.handoff_bytes === null
      ? 'hand-offs unpriced (no mesh)'
      : `hand-off per tick ${fmt.bytes(s.handoff_bytes)}, ${fmt.seconds(s.handoff_s)} (collective-permute over ${s.axis}, ${s.handoffs} per step)`;
  return h(
    'div',
    {
      className: 'tl-schedule',
      'data-stages': s.stages,
      'data-micro-batches': s.micro_batches,
      'data-bubble': s.bubble
    },
    h(
      'div',
      { className: 'tl-schedule-head' },
      `Schedule (${s.schedule === 'gpipe' ? 'GPipe' : `${s.schedule}, ${s.chunks ?? 1} runs per stage`}): ${s.micro_batches} micro-batch${s.micro_batches === 1 ? '' : 'es'} through ${s.stages} stages over ${s.axis}`
    ),
    h(
      'div',
      { className: 'tl-schedule-figures' },
      h('span', { className: 'tl-schedule-bubble' }, h('b', null, `bubble ${idle}/${s.ticks} = ${(100 * s.bubble).toFixed(0)}%`), ` of each stage's ticks (hatched)`),
      h('span', { className: 'tl-schedule-handoff' }, handoff)
    ),
    chart.node,
    h(
      'div',
      { className: 'tl-bar-legend tl-schedule-legend' },
      h('span', null, h('span', { className: 'tl-swatch', style: `background:${FORWARD}` }), (s.chunks ?? 1) > 1 ? 'F m.r: forward of micro-batch m, run r' : 'F m: forward of micro-batch m'),
      h('span', null, h('span', { className: 'tl-swatch', style: `background:${BACKWARD}` }), (s.chunks ?? 1) > 1 ? 'B m.r: its backward' : 'B m: its backward'),
      h('span', null, h('span', { className: 'tl-swatch tl-swatch-idle' }), 'idle: the bubble')
    )
  );
}
