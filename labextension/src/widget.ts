/**
 * The Lab as an ipywidgets widget: model `LabViewModel` and view `LabView` in module
 * "toast-lab". Traitlets (Python `toast_lab.lab._widget.LabView`): `view` (the ViewModel dict)
 * and `op_costs` (bytes: little-endian float64 [compute_s, comm_s] per op, op id order).
 * Events go to the kernel as custom messages `{"event": ..., ...}`.
 */
import type * as Backbone from 'backbone';
import { DOMWidgetModel, DOMWidgetView, IBackboneModelOptions, ISerializers } from '@jupyter-widgets/base';

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
      op_costs: null
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

  render(): void {
    this.el.classList.add('tl-widget');
    this.graphView = new LabGraphView({
      interactive: true,
      send: (event: LabEvent) => this.send(event)
    });
    this.el.appendChild(this.graphView.node);
    this.listenTo(this.model, 'change:view', () => this.draw());
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
    void this.graphView.update(view, this.model.get('op_costs') as Float64Array | null);
  }
}
