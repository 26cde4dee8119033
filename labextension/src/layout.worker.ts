/**
 * Graphviz (compiled to WebAssembly by @viz-js/viz, the wasm inlined in the bundle) in a web
 * worker, so a large layout never blocks the page. Request: {seq, dot}; reply: {seq, svg} or
 * {seq, error}.
 */
import { instance } from '@viz-js/viz';

const ready = instance();

self.onmessage = async (ev: MessageEvent<{ seq: number; dot: string }>) => {
  const { seq, dot } = ev.data;
  try {
    const viz = await ready;
    const result = viz.render(dot, { format: 'svg', engine: 'dot' });
    if (result.status === 'success') {
      postMessage({ seq, svg: result.output });
    } else {
      const errors = result.errors.map(e => `${e.level ?? 'error'}: ${e.message}`).join('\n');
      postMessage({ seq, error: errors || 'Graphviz failed without a message' });
    }
  } catch (err) {
    postMessage({ seq, error: String(err) });
  }
};
