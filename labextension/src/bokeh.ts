/**
 * BokehJS, loaded once into the page by this extension: the Lab's charts are jupyter_bokeh
 * widgets (`BokehModel`), whose views need `window.Bokeh`. The bundle carries BokehJS's own
 * minified build from the npm package `@bokeh/bokehjs`, pinned in package.json to the version
 * of the Python package `bokeh` (a test checks both), so no notebook output embeds BokehJS and
 * no CDN is needed.
 */
import bokehPackage from '@bokeh/bokehjs/package.json';
import bokehUrl from '@bokeh/bokehjs/build/js/bokeh.min.js?url';

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
