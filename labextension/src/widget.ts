/**
 * The Lab as an ipywidgets widget: model `LabViewModel` and view `LabView` in module
 * "toast-lab". Traitlets (Python `toast_lab.lab._widget.LabView`): `view` (the ViewModel dict),
 * `op_costs` (bytes: little-endian float64 [compute_s, comm_s] per op, op id order) and
 * `progress` (what the kernel is still doing for the Lab, "" when nothing).
 * Events go to the kernel as custom messages `{"event": ..., ...}`.
 */
import type * as Backbone from 'backbone';
import { DOMWidgetModel, DOMWidgetView, IBackboneModelOptions, ISerializers } from '@jupyter-widgets/base';

import { fill, h } from './dom';
import { sharedLayout } from './layout';
import { MODULE_NAME, MODULE_VERSION } from './version';
import { LabGraphView } from './view';
import { isViewModel, LabEvent } from './viewmodel';

export class LabViewModel extends DOMWidgetModel {
  defaults(): Backbone.ObjectHash {
    return {
      ...super.defaults(),
      _model_name: 'LabViewModel',
      _model_module: MODULE_NAME,
      _model_module_version: MODULE_VERSION,
      _view_name: 'LabView',
      _view_module: MODULE_NAME,
      _view_module_version: MODULE_VERSION,
      view: {},
      op_costs: null,
      progress: ''
    };
  }

  static serializers: ISerializers = {
    ...DOMWidgetModel.serializers,
    op_costs: { deserialize: opCostsFromBuffer }
  };

  initialize(attributes: Backbone.ObjectHash, options: IBackboneModelOptions): void {
    super.initialize(attributes, options);
    // The model exists from the Lab's construction on (the kernel opens its comm then), well
    // before the Lab is displayed: start Graphviz and lay out the first graph meanwhile.
    this.prefetch();
    this.on('change:view', () => this.prefetch());
  }

  private prefetch(): void {
    const view = this.get('view') as unknown;
    if (isViewModel(view) && Object.keys(this.views ?? {}).length === 0) {
      sharedLayout().prefetch(view.graph.dot);
    }
  }
}

/** The op_costs buffer as [compute_s, comm_s, compute_s, comm_s, ...] (little-endian float64). */
export function opCostsFromBuffer(value: unknown): Float64Array | null {
  if (!value) {
    return null;
  }
  const dv = value instanceof DataView ? value : ArrayBuffer.isView(value) ? new DataView(value.buffer, value.byteOffset, value.byteLength) : value instanceof ArrayBuffer ? new DataView(value) : null;
  if (!dv) {
    return null;
  }
  const out = new Float64Array(Math.floor(dv.byteLength / 8));
  for (let i = 0; i < out.length; i++) {
    out[i] = dv.getFloat64(8 * i, true);
  }
  return out;
}

export class LabView extends DOMWidgetView {
  private graphView: LabGraphView | null = null;
  /** What the Lab is still doing: the kernel's `progress`, and the first graph's layout. */
  private building = h('div', { className: 'tl-building', role: 'status', hidden: true });
  private laidOut = false;
  private layingOut: string | null = null;

  render(): void {
    this.el.classList.add('tl-widget');
    this.graphView = new LabGraphView({
      interactive: true,
      send: (event: LabEvent) => this.send(event)
    });
    this.el.appendChild(this.building);
    this.el.appendChild(this.graphView.node);
    this.listenTo(this.model, 'change:view', () => this.draw());
    this.listenTo(this.model, 'change:progress', () => this.showBuilding());
    this.showBuilding();
    this.listenTo(this.model, 'change:op_costs', () =>
      this.graphView?.setOpCosts(this.model.get('op_costs') as Float64Array | null)
    );
    this.draw();
  }

  remove(): void {
    this.graphView?.dispose();
    this.graphView = null;
    return super.remove();
  }

  private draw(): void {
    const view = this.model.get('view') as unknown;
    if (!this.graphView) {
      return;
    }
    if (!isViewModel(view)) {
      this.graphView.node.dataset.empty = 'true';
      return;
    }
    const drawn = this.graphView.update(view, this.model.get('op_costs') as Float64Array | null);
    if (!this.laidOut) {
      this.layingOut = `laying out the graph (${view.graph.nodes.length} nodes)`;
      this.showBuilding();
      const done = () => {
        this.laidOut = true;
        this.layingOut = null;
        this.showBuilding();
      };
      void drawn.then(done, done);
    }
  }

  /** The progress line: the kernel's work, then the page's; hidden when both are done. */
  private showBuilding(): void {
    const parts = [this.model.get('progress') as string, this.layingOut].filter(p => !!p);
    this.building.hidden = parts.length === 0;
    fill(this.building, parts.length ? h('span', { className: 'tl-spinner' }) : null, parts.join(' · '));
  }
}
