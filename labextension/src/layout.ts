/**
 * Lays out DOT into SVG text with Graphviz-WASM. Runs in a web worker when the page allows one
 * (keeps the page responsive while Graphviz runs on a large graph); falls back to the main
 * thread when a worker cannot start. Results are cached by DOT text, so toggling a group back
 * shows its earlier layout at once.
 */

type Reply = { seq: number; svg?: string; error?: string };

const CACHE_SIZE = 24;

export class GraphLayout {
  private worker: Worker | null = null;
  private workerFailed = false;
  private seq = 0;
  private pending = new Map<number, { resolve: (s: string) => void; reject: (e: Error) => void }>();
  private cache = new Map<string, string>();
  /** Layouts under way, by DOT: a second request for the same graph waits for the first. */
  private running = new Map<string, Promise<string>>();
  private mainThread: Promise<{ renderString(dot: string, o: object): string }> | null = null;

  /** The SVG text for `dot`. */
  layout(dot: string): Promise<string> {
    const hit = this.cache.get(dot);
    if (hit !== undefined) {
      this.cache.delete(dot);
      this.cache.set(dot, hit);
      return Promise.resolve(hit);
    }
    let run = this.running.get(dot);
    if (!run) {
      run = this.compute(dot).finally(() => this.running.delete(dot));
      this.running.set(dot, run);
    }
    return run;
  }

  /**
   * Lays `dot` out ahead of time, so that drawing it later takes no Graphviz time (the Lab's
   * model calls this when a view arrives before any view of it is on the page: while the
   * kernel is still busy, the page's worker starts and lays out the first graph).
   */
  prefetch(dot: string): void {
    this.layout(dot).catch(() => undefined); // a failure shows when the graph is drawn
  }

  private async compute(dot: string): Promise<string> {
    let svg: string;
    try {
      svg = await this.inWorker(dot);
    } catch (err) {
      if (!this.workerFailed) {
        throw err; // Graphviz itself refused the DOT: say so, do not retry on the main thread
      }
      svg = await this.onMainThread(dot);
    }
    this.cache.set(dot, svg);
    if (this.cache.size > CACHE_SIZE) {
      this.cache.delete(this.cache.keys().next().value as string);
    }
    return svg;
  }

  dispose(): void {
    this.worker?.terminate();
    this.worker = null;
    for (const p of this.pending.values()) {
      p.reject(new Error('layout disposed'));
    }
    this.pending.clear();
  }

  private startWorker(): Worker | null {
    if (this.worker || this.workerFailed) {
      return this.worker;
    }
    try {
      this.worker = new Worker(new URL('./layout.worker.js', import.meta.url));
    } catch (err) {
      console.warn('toast-lab: no web worker for Graphviz, laying out on the main thread', err);
      this.workerFailed = true;
      return null;
    }
    this.worker.onmessage = (ev: MessageEvent<Reply>) => {
      const p = this.pending.get(ev.data.seq);
      if (!p) {
        return;
      }
      this.pending.delete(ev.data.seq);
      if (ev.data.svg !== undefined) {
        p.resolve(ev.data.svg);
      } else {
        p.reject(new Error(ev.data.error ?? 'Graphviz failed'));
      }
    };
    this.worker.onerror = ev => {
      // The worker script could not load (e.g. a page that forbids workers): fall back.
      console.warn('toast-lab: Graphviz worker failed, laying out on the main thread', ev.message);
      ev.preventDefault();
      this.workerFailed = true;
      this.worker?.terminate();
      this.worker = null;
      const waiting = [...this.pending.values()];
      this.pending.clear();
      for (const p of waiting) {
        p.reject(new Error('worker failed'));
      }
    };
    return this.worker;
  }

  private inWorker(dot: string): Promise<string> {
    const worker = this.startWorker();
    if (!worker) {
      return Promise.reject(new Error('no worker'));
    }
    const seq = ++this.seq;
    return new Promise((resolve, reject) => {
      this.pending.set(seq, { resolve, reject });
      worker.postMessage({ seq, dot });
    });
  }

  private async onMainThread(dot: string): Promise<string> {
    if (!this.mainThread) {
      this.mainThread = import('@viz-js/viz').then(m => m.instance());
    }
    const viz = await this.mainThread;
    return viz.renderString(dot, { format: 'svg', engine: 'dot' });
  }
}

/** One layout engine per page: the worker and its cache are shared by every view. */
let shared: GraphLayout | null = null;
export function sharedLayout(): GraphLayout {
  if (!shared) {
    shared = new GraphLayout();
  }
  return shared;
}
