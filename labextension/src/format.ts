/** Number formatting for seconds and bytes, the two units of every estimate. */

/** Three significant digits, never in exponent form: 1,010 KiB, not 1.01e+3 KiB. */
function three(a: number): string {
  return Math.abs(a) >= 999.5 ? Math.round(a).toLocaleString('en-US') : a.toPrecision(3);
}

export function seconds(s: number | null | undefined): string {
  if (s === null || s === undefined || !isFinite(s)) {
    return '–';
  }
  const a = Math.abs(s);
  if (a === 0) {
    return '0 s';
  }
  if (a < 1e-6) {
    return `${three(s * 1e9)} ns`;
  }
  if (a < 1e-3) {
    return `${three(s * 1e6)} µs`;
  }
  if (a < 1) {
    return `${three(s * 1e3)} ms`;
  }
  return `${three(s)} s`;
}

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

export function bytes(b: number | null | undefined): string {
  if (b === null || b === undefined || !isFinite(b)) {
    return '–';
  }
  let a = Math.abs(b);
  let u = 0;
  while (a >= 1024 && u < UNITS.length - 1) {
    a /= 1024;
    u++;
  }
  const sign = b < 0 ? '−' : '';
  return `${sign}${u === 0 ? a.toFixed(0) : three(a)} ${UNITS[u]}`;
}

/** Below this a difference of seconds or bytes is rounding in the sums, not a change: a
 * picosecond, or a trillionth of a byte. */
export const NEGLIGIBLE = 1e-12;

/** A signed difference, "+1.20 ms" / "−3.0 GiB" / "±0". */
export function delta(d: number | null, unit: (x: number) => string): string {
  if (d === null || !isFinite(d)) {
    return '';
  }
  if (Math.abs(d) < NEGLIGIBLE) {
    return '±0';
  }
  return d > 0 ? `+${unit(d)}` : `−${unit(-d).replace('−', '')}`;
}

export function axes(a: string[]): string {
  return a.length === 0 ? 'replicated' : a.join('×');
}
