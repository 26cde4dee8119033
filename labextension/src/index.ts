/**
 * toast-lab's JupyterLab extension: two plugins sharing one graph view (./view), and BokehJS.
 *  - `toast-lab:bokehjs` loads BokehJS into the page once (./bokeh), before any notebook is
 *    shown: the Lab's charts are jupyter_bokeh widgets, whose views need `window.Bokeh`;
 *  - `toast-lab:widget` registers the Lab widget (LabViewModel / LabView) with ipywidgets;
 *  - `toast-lab:plan-viewer` draws plan outputs (`application/vnd.toast-lab.plan+json`) and
 *    plan diffs (`application/vnd.toast-lab.plan-diff+json`), and opens plan files
 *    (`*plan.json`, `*.toastplan.json`; "Open With" for any JSON) without a kernel.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { IJupyterWidgetRegistry } from '@jupyter-widgets/base';
import { MimeDocumentFactory } from '@jupyterlab/docregistry';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';

import { BOKEHJS_VERSION, loadBokehJS } from './bokeh';
import { diffRendererFactory } from './diffviewer';
import { PLAN_MIME_TYPE, planRendererFactory } from './planviewer';
import { MODULE_NAME, MODULE_VERSION } from './version';

/** Plan files: `plan.json`, `gpt_plan.json`, `gpt-plan.json`, `gpt.plan.json`, `x.toastplan.json`. */
export const PLAN_FILE_PATTERN = '^(.*[._-])?plan\\.json$|\\.toastplan\\.json$';
export const PLAN_FILE_TYPE = 'toast-lab-plan';
export const PLAN_VIEWER = 'toast-lab plan';

const bokehPlugin: JupyterFrontEndPlugin<void> = {
  id: 'toast-lab:bokehjs',
  description: `Loads BokehJS ${BOKEHJS_VERSION} for the Lab's charts (no output embeds it).`,
  autoStart: true,
  // JupyterLab shows its shell, and with it any notebook, once every plugin that starts with
  // it has activated: awaiting BokehJS here puts it in the page before a chart's view exists.
  activate: async () => {
    try {
      await loadBokehJS();
    } catch (err) {
      console.error(`toast-lab: ${err}; the Lab's charts will not draw`);
    }
  }
};

const widgetPlugin: JupyterFrontEndPlugin<void> = {
  id: 'toast-lab:widget',
  description: 'The toast-lab Lab widget (ipywidgets): graph, decisions, estimate, search.',
  requires: [IJupyterWidgetRegistry],
  autoStart: true,
  activate: (_app: JupyterFrontEnd, registry: IJupyterWidgetRegistry) => {
    registry.registerWidget({
      name: MODULE_NAME,
      version: MODULE_VERSION,
      exports: async () => {
        const { LabViewModel, LabView } = await import('./widget');
        return { LabViewModel, LabView };
      }
    });
  }
};

const planViewerPlugin: JupyterFrontEndPlugin<void> = {
  id: 'toast-lab:plan-viewer',
  description: 'Draws toast-lab plan outputs, plan diffs and plan files without a kernel.',
  requires: [IRenderMimeRegistry],
  autoStart: true,
  activate: (app: JupyterFrontEnd, rendermime: IRenderMimeRegistry) => {
    rendermime.addFactory(planRendererFactory, planRendererFactory.defaultRank);
    rendermime.addFactory(diffRendererFactory, diffRendererFactory.defaultRank);
    const fileType = {
      name: PLAN_FILE_TYPE,
      displayName: 'toast-lab plan',
      mimeTypes: [PLAN_MIME_TYPE],
      extensions: ['.toastplan.json'],
      pattern: PLAN_FILE_PATTERN,
      fileFormat: 'text' as const,
      contentType: 'file' as const
    };
    app.docRegistry.addFileType(fileType);
    app.docRegistry.addWidgetFactory(
      new MimeDocumentFactory({
        name: PLAN_VIEWER,
        label: 'toast-lab plan viewer',
        primaryFileType: app.docRegistry.getFileType(PLAN_FILE_TYPE),
        fileTypes: [PLAN_FILE_TYPE, 'json'],
        defaultFor: [PLAN_FILE_TYPE],
        rendermime,
        dataType: 'json',
        renderTimeout: 15000,
        factory: planRendererFactory
      })
    );
  }
};

export default [bokehPlugin, widgetPlugin, planViewerPlugin];
