/**
 * BokehJS, loaded once into the page by this extension: the Lab's live charts are jupyter_bokeh
 * widgets (`BokehModel`), whose views need `window.Bokeh`; the charts the view draws itself
 * from the view model (the memory chart, also in the kernel-less plan viewer) use BokehJS's
 * plotting API (`bokeh-api`), loaded on top the first time one is drawn. The bundle carries
 * BokehJS's own minified builds from the npm package `@bokeh/bokehjs`, pinned in package.json
 * to the version of the Python package `bokeh` (a test checks both), so no notebook output
 * embeds BokehJS and no CDN is needed.
 */
import type * as BokehAPI from '@bokeh/bokehjs';
import bokehPackage from '@bokeh/bokehjs/package.json';
import bokehUrl from '@bokeh/bokehjs/build/js/bokeh.min.js?url';
import bokehApiUrl from '@bokeh/bokehjs/build/js/bokeh-api.min.js?url';
import { h, fill } from './dom';

/** `window.Bokeh` with its plotting API: `Plotting.figure`, `Plotting.show`, the models. */
export type BokehPlotting = typeof BokehAPI;

/** The BokehJS version this extension loads. */
export const BOKEHJS_VERSION: string = bokehPackage.version;

interface BokehGlobal {
  version: string;
}

declare global {
  interface Window {
    Bokeh?: BokehGlobal & Record<string, unknown>;
  }
}

let loading: Promise<void> | null = null;
let loadingApi: Promise<BokehPlotting> | null = null;

/**
 * Loads BokehJS with a <script> tag unless the page has this version already (an output of
 * `bokeh.io.output_notebook()` may have loaded it). Resolves once `window.Bokeh` is there.
 */
export function loadBokehJS(): Promise<void> {
  if (window.Bokeh?.version === BOKEHJS_VERSION) {
    return Promise.resolve();
  }
  if (loading === null) {
    loading = new Promise<void>((resolve, reject) => {
      const script = document.createElement('script');
      script.src = bokehUrl;
      script.async = true;
      script.dataset.toastLab = 'bokehjs';
      script.onload = () =>
        window.Bokeh
          ? resolve()
          : reject(new Error(`BokehJS ${BOKEHJS_VERSION} loaded from ${bokehUrl} but set no window.Bokeh`));
      script.onerror = () => reject(new Error(`could not load BokehJS ${BOKEHJS_VERSION} from ${bokehUrl}`));
      document.head.appendChild(script);
    });
    loading.catch(() => {
      loading = null; // a later call tries again
    });
  }
  return loading;
}

/** BokehJS with its plotting API, loaded (once) on top of `loadBokehJS()`'s. */
export function loadBokehPlotting(): Promise<BokehPlotting> {
  const ready = () => window.Bokeh as unknown as BokehPlotting;
  if (loadingApi === null) {
    loadingApi = loadBokehJS().then(() =>
      window.Bokeh?.Plotting
        ? ready()
        : new Promise<BokehPlotting>((resolve, reject) => {
            const script = document.createElement('script');
            script.src = bokehApiUrl;
            script.async = true;
            script.dataset.toastLab = 'bokehjs-api';
            script.onload = () =>
              window.Bokeh?.Plotting
                ? resolve(ready())
                : reject(new Error(`BokehJS's plotting API ${BOKEHJS_VERSION} loaded from ${bokehApiUrl} but set no Bokeh.Plotting`));
            script.onerror = () => reject(new Error(`could not load BokehJS's plotting API ${BOKEHJS_VERSION} from ${bokehApiUrl}`));
            document.head.appendChild(script);
          })
    );
    loadingApi.catch(() => {
      loadingApi = null; // a later call tries again
    });
  }
  return loadingApi;
}

/** Forgets a chart's document: BokehJS keeps every document it has shown in `documents`. */
export function dropDocument(bokeh: BokehPlotting, doc: unknown): void {
  const docs = bokeh.documents as unknown[];
  const i = doc === null ? -1 : docs.indexOf(doc);
  if (i >= 0) {
    docs.splice(i, 1);
  }
}

/** What BokehJS drew in the page: removed before a redraw. */
export interface DrawnPlot {
  remove(): void;
}

type Plot = ReturnType<BokehPlotting['Plotting']['figure']>;

/**
 * One plot a chart draws itself from the view model (the memory chart, the schedule chart):
 * BokehJS loaded, the plot shown, and the previous plot and its document dropped first; a
 * draw whose input was replaced while BokehJS loaded or drew gives way to the newer one.
 */
export class PlotSlot<View extends DrawnPlot = DrawnPlot> {
  /** The drawn plot's view, once shown. */
  view: View | null = null;
  private key = '';
  private bokeh: BokehPlotting | null = null;
  private document: unknown = null;

  /** Whether input `key` needs a draw: false when it is drawn (or being drawn); otherwise
   * the slot takes the key and drops the plot it held. */
  claim(key: string): boolean {
    if (key === this.key) {
      return false;
    }
    this.key = key;
    this.remove();
    return true;
  }

  /** Shows `figure`'s plot in `target` for input `key`; says in `target` why it cannot (`what`
   * names the chart). Resolves true once shown, false where newer input took its place. */
  async show(key: string, target: HTMLElement, what: string,
             figure: (bokeh: BokehPlotting) => Plot): Promise<boolean> {
    let bokeh: BokehPlotting;
    try {
      bokeh = await loadBokehPlotting();
    } catch (err) {
      this.key = ''; // a later update tries again
      fill(target, h('div', { className: 'tl-empty', role: 'alert' }, `The ${what} could not be drawn: ${err}.`));
      return false;
    }
    if (key !== this.key) {
      return false; // newer input arrived while BokehJS loaded
    }
    const plot = figure(bokeh);
    fill(target);
    this.bokeh = bokeh;
    const drawn = await bokeh.Plotting.show(plot, target);
    if (key !== this.key) {
      drawn.remove(); // newer input arrived while it drew: its own draw replaces this one
      dropDocument(bokeh, plot.document);
      return false;
    }
    this.view = drawn as unknown as View;
    this.document = plot.document;
    return true;
  }

  /** Drops the plot and forgets the input: the next draw draws. */
  dispose(): void {
    this.remove();
    this.key = '';
  }

  private remove(): void {
    this.view?.remove();
    this.view = null;
    if (this.bokeh) {
      dropDocument(this.bokeh, this.document);
    }
    this.document = null;
  }
}
