/**
 * What the legend lists: the classes the plan shards and the largest ones at stake, each in
 * its own colour (Python chose them: `ClassView.legend`), then every other class under one grey
 * entry, and the minor classes (almost nothing at stake) under another. Hovering an entry
 * lights its classes across the graph.
 */
import * as fmt from './format';
import { ClassView, ViewModel } from './viewmodel';

/** Replicated tensors and the classes the legend does not name (_palette.py's NEUTRAL). */
export const NEUTRAL = '#9AA0A6';

export interface LegendEntry {
  label: string;
  color: string;
  /** The mesh axes the plan gives it ('' when replicated, or for a group of classes). */
  axes: string;
  classes: number[];
  title: string;
  /** 'others' or 'minor' for an entry that stands for several classes. */
  group?: 'others' | 'minor';
}

export function legendEntries(view: ViewModel): LegendEntry[] {
  const bySize = [...view.classes].sort((a, b) => b.bytes - a.bytes || a.id - b.id);
  // A view model from before the legend was chosen in Python lists every class.
  const chosen = view.classes.some(c => c.legend !== undefined);
  const shown = bySize.filter(c => !chosen || c.legend);
  const minor = bySize.filter(c => chosen && !c.legend && c.minor);
  const others = bySize.filter(c => chosen && !c.legend && !c.minor);
  const out: LegendEntry[] = shown.map(c => ({
    label: c.name,
    color: c.color,
    axes: c.axes.length ? c.axes.join('×') : '',
    classes: [c.id],
    title: `${c.name}: size ${c.size}, ${fmt.bytes(c.bytes)} at stake, ${fmt.axes(c.axes)}`
  }));
  if (others.length) {
    out.push(group('others', `${others.length} more`, others, 'replicated, drawn grey'));
  }
  if (minor.length) {
    out.push(group('minor', `minor (${minor.length})`, minor, 'almost nothing at stake'));
  }
  return out;
}

function group(kind: 'others' | 'minor', label: string, classes: ClassView[], what: string): LegendEntry {
  const names = classes.map(c => `${c.name} (${fmt.bytes(c.bytes)})`);
  return {
    label,
    color: NEUTRAL,
    axes: '',
    classes: classes.map(c => c.id),
    title: `${classes.length} ${classes.length === 1 ? 'class' : 'classes'}, ${what}: ${names.slice(0, 12).join(', ')}${names.length > 12 ? ', …' : ''}`,
    group: kind
  };
}
