/** A tiny hyperscript for building the view's DOM without a framework. */

type Child = Node | string | number | null | undefined | false;
type Attrs = Record<string, string | number | boolean | null | undefined | EventListener>;

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs | null = null,
  ...children: (Child | Child[])[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) {
        continue;
      }
      if (k.startsWith('on') && typeof v === 'function') {
        el.addEventListener(k.slice(2), v as EventListener);
      } else if (k === 'className') {
        el.className = String(v);
      } else if (k === 'style') {
        el.setAttribute('style', String(v));
      } else if (v === true) {
        el.setAttribute(k, '');
      } else {
        el.setAttribute(k, String(v));
      }
    }
  }
  append(el, children);
  return el;
}

function append(el: Element, children: (Child | Child[])[]): void {
  for (const c of children) {
    if (Array.isArray(c)) {
      append(el, c);
    } else if (c !== null && c !== undefined && c !== false) {
      el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
  }
}

/** Replaces the children of `el`. */
export function fill(el: Element, ...children: (Child | Child[])[]): void {
  el.textContent = '';
  append(el, children);
}

export const SVG_NS = 'http://www.w3.org/2000/svg';

export function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number> = {}
): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    el.setAttribute(k, String(v));
  }
  return el;
}

/** A colour chip for a class. */
export function chip(color: string, text: string, title?: string): HTMLSpanElement {
  return h(
    'span',
    { className: 'tl-chip', title: title ?? text },
    h('span', { className: 'tl-swatch', style: `background:${color}` }),
    text
  );
}
