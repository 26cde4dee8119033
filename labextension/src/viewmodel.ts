/**
 * The Lab's view model, mirrored field for field from toast_lab/lab/_viewmodel.py (snake_case
 * on both sides). Python builds it; this package only draws it and sends `LabEvent`s back.
 * Fields added after a plan file was written are optional here: old files lack them.
 */

export interface ViewModel {
  format: 'toast-lab-view';
  version: 1;
  program: { name: string; ops: number; fingerprint: string };
  mesh: { axes: Record<string, number>; device: string; memory_bytes: number } | null;
  classes: ClassView[];
  conflicts: ConflictView[];
  groups: GroupView[];
  graph: GraphView;
  estimate: EstimateView | null;
  experts: ExpertRow[];
  search: SearchView;
  snippet: string;
  error: string | null;
  selected: { kind: SelectionKind; id: string } | null;
  details: DetailsView | null;
  pinned: string[];
  /** What the last action did besides the obvious (not an error), e.g. "wrote plan.json". */
  notice?: string | null;
  /** The plan the session started on ("start: fsdp, 31.8 ms"). */
  start?: StartView | null;
  /** The collectives of the selected op or edge, explained. */
  explained?: ExplainedView | null;
  /** Live bytes per device over the step, for the memory chart (null: no mesh to price it;
   * absent: a view saved before the chart). */
  memory?: MemoryView | null;
  /** The decisions beyond sharding: a remat policy per layer group, the micro-batch count,
   * pipeline stages per scanned stack (absent: a view saved before they were offered). */
  steps?: StepDecisionView[];
  /** A pipelined plan's schedule (null: no stages; absent: a view saved before it). */
  schedule?: ScheduleView | null;
  /** Why the prices (estimate, choices, expert plans, memory) are not there yet, in words
   * ("compiling the cost model (...)"); null once they are: every price shows "–". */
  pricing?: string | null;
}

export type SelectionKind = 'op' | 'group' | 'class' | 'conflict' | 'edge';

export interface StartView {
  name: string;
  /** 'unpriced': the plan shown until the prices come (its figures null). */
  how: 'expert' | 'search' | 'given' | 'smallest' | 'unpriced';
  step_time_s: number | null;
  peak_memory_bytes: number | null;
  note: string;
  label: string;
}

export interface ClassView {
  id: number;
  name: string;
  size: number;
  bytes: number;
  layers: number;
  color: string;
  axes: string[];
  pinned: boolean;
  choices: ChoiceView[];
  /** Under MINOR_SHARE of the largest class's bytes at stake: listed under one "minor" entry. */
  minor?: boolean;
  /** The legend shows it (the plan shards it, or it is among the largest) in its own colour. */
  legend?: boolean;
}

export interface ConflictView {
  id: number;
  name: string;
  class_id: number;
  class_name: string;
  where: string;
  source: string;
  active: boolean;
  resolution: string;
  resolutions: string[];
  pinned: boolean;
  choices: ChoiceView[];
  /** Each resolution in words, in the order of `resolutions` ("keep the query positions"). */
  labels?: string[];
}

/** A decision beyond sharding ("remat@block", "micro_batches", "pipeline@block") and its
 * priced choices. */
export interface StepDecisionView {
  name: string;
  /** In words: "remat: block (scanned ×4)", "micro-batches", "pipeline stages: block (scanned ×4)". */
  label: string;
  /** A remat policy, a micro-batch count, or stages ("stage:4", "none"). */
  value: string | number;
  pinned: boolean;
  choices: ChoiceView[];
}

/**
 * A pipelined plan's schedule (toast_lab/lab/_schedule.py): which work item each stage runs
 * at each tick of the step's forward and backward loops (r * micro_batches + m: micro-batch m
 * in its run r of the stage's `chunks` runs; m itself for GPipe), -1 where it idles (the
 * bubble), and one hand-off between stages (a collective-permute over `axis`; null unpriced).
 */
export interface ScheduleView {
  /** The decision, "pipeline@block". */
  name: string;
  group: string;
  /** The scope-tree group the graph draws the stack as. */
  scope: string | null;
  axis: string;
  stages: number;
  layers: number;
  micro_batches: number;
  /** "gpipe" or "circular". */
  schedule: string;
  /** Runs of layers per stage (1 for GPipe); run r of stage s holds layer chunk r * stages + s. */
  chunks?: number;
  /** Per loop: chunks * micro_batches + stages - 1. */
  ticks: number;
  /** The idle share of each stage's ticks, (stages - 1) / ticks. */
  bubble: number;
  /** [stage][tick]: the work item run, -1 idle. */
  forward: number[][];
  backward: number[][];
  /** One hand-off per device: bytes and seconds; how many per step. */
  handoff_bytes: number | null;
  handoff_s: number | null;
  handoffs: number | null;
}

export interface ChoiceView {
  label: string;
  /** Mesh axes (a class), a resolution (a conflict), a policy or a count (a step decision). */
  value: string[] | string | number;
  current: boolean;
  valid: boolean;
  reason: string | null;
  step_time_s: number | null;
  peak_memory_bytes: number | null;
  /** What else happens when chosen, e.g. an axis another class holds stays with it. */
  note?: string | null;
}

export interface GroupView {
  id: string;
  label: string;
  parent: string | null;
  children: string[];
  repeat: number;
  ops: number;
  compute_s: number;
  comm_s: number;
  classes: number[];
  conflicts: number[];
  expanded: boolean;
}

export interface GraphView {
  dot: string;
  nodes: NodeView[];
  edges: EdgeView[];
}

export interface NodeView {
  id: string;
  kind: 'group' | 'op' | 'input' | 'output';
  group: string | null;
  label: string;
  op: number | null;
  classes: number[];
  conflicts: number[];
  compute_s: number;
  comm_s: number;
  collectives: string[];
  /** The classes the plan shards on what it computes (its colours), largest first. */
  sharded?: number[];
}

export interface EdgeView {
  id: string;
  source: string;
  target: string;
  classes: number[];
  label: string;
  badge: string | null;
  /** The classes the plan shards on these tensors (the edge's colours). */
  sharded?: number[];
}

export interface EstimateView {
  step_time_s: number;
  compute_s: number;
  communication_s: number;
  exposed_communication_s?: number;
  communication_by_axis: Record<string, number>;
  peak_memory_bytes: number;
  memory_capacity_bytes: number;
  feasible: boolean;
  memory_breakdown: Record<string, number>;
  /** Per top-level name scope: its compute and communication seconds. */
  by_scope?: Record<string, { compute_s: number; comm_s: number }>;
  [key: string]: unknown;
}

export interface ExpertRow {
  name: string;
  step_time_s: number;
  peak_memory_bytes: number;
  feasible: boolean;
  classes: Record<string, string[]>;
  /** The pins it contradicts ("batch=data"): a search under them cannot reach it. */
  ruled_out_by?: string[];
}

/** history rows: (t s, simulations, best step time s, its peak memory B). */
export interface SearchView {
  running: boolean;
  simulations: number;
  elapsed_s: number;
  sims_per_s: number;
  best_step_time_s: number | null;
  history: [number, number, number, number][];
  /** How the last search ended (null while none has). */
  message?: string | null;
}

export interface DetailsView {
  op: number;
  primitive: string;
  source: string;
  scope: string;
  operands: TensorView[];
  results: TensorView[];
  compute_s: number;
  comm_s: number;
  collectives: string[];
}

export interface TensorView {
  value: number;
  shape: number[];
  dtype: string;
  classes: (string | null)[];
  spec: string;
  /** The mesh axes of each dim, major to minor. */
  dim_axes?: string[][];
}

/** A choice that removes a collective, priced from the current plan. */
export interface RemedyView {
  name: string;
  value: string[] | string;
  label: string;
  step_time_s: number;
  peak_memory_bytes: number;
}

/** One collective an op pays, explained (all layers drawn as the op together). */
export interface CollectiveView {
  op: number;
  primitive: string;
  source: string;
  scope: string;
  kind: string;
  axes: string[];
  label: string;
  operand: number | null;
  tensor: string;
  classes: string[];
  why: string;
  count: number;
  bytes: number;
  time_s: number;
  layers: number;
  patterns: string[];
  remedy: RemedyView | null;
}

export interface ExplainedView {
  kind: 'op' | 'edge';
  id: string;
  subject: string;
  collectives: CollectiveView[];
}

/**
 * Live bytes per device over one step (CostModel.memory_timeline), sampled: `positions` are
 * places in the order the ops run (0..steps-1, ascending), `ops` the op at each, and
 * `categories` the bytes of each category there (whole bytes, the bottom of the stack first).
 * The peak is one of the positions; its bytes are the estimate's peak_memory_bytes.
 */
export interface MemoryView {
  steps: number;
  positions: number[];
  ops: number[];
  categories: Record<string, number[]>;
  peak_position: number;
  peak_op: number;
  peak_bytes: number;
  peak_primitive: string;
  peak_source: string;
  peak_scope: string;
}

/** Events from the view to Python (ipywidgets custom messages `{"event": ..., ...}`). */
export type LabEvent =
  | { event: 'pin'; name: string; value: string[] | string | number }
  | { event: 'unpin'; name: string }
  | { event: 'toggle'; group: string }
  | { event: 'select'; kind: SelectionKind; id: string }
  | { event: 'search'; budget_s: number }
  | { event: 'stop' }
  | { event: 'export'; path: string };

/**
 * Where the view's events go. The widget sends them to the kernel; the kernel-less viewer is
 * read-only (`interactive` false): it never sends pin/search/export, and handles `toggle`
 * itself by expanding what the file carries.
 */
export interface LabEventSink {
  readonly interactive: boolean;
  send(event: LabEvent): void;
}

/** True when `x` looks like a view model (the fields the view cannot draw without). */
export function isViewModel(x: unknown): x is ViewModel {
  const v = x as ViewModel | null;
  return (
    !!v &&
    typeof v === 'object' &&
    v.format === 'toast-lab-view' &&
    Array.isArray(v.classes) &&
    !!v.graph &&
    typeof v.graph.dot === 'string'
  );
}

/** A conflict's current resolution in words (its id, in a view model from before the words). */
export function resolutionLabel(c: ConflictView): string {
  const i = c.resolutions.indexOf(c.resolution);
  return c.labels && i >= 0 ? c.labels[i] : c.resolution;
}
