// The memory chart: charged bytes by kind (stacked) plus the runtime's own
// bytes, with the measured RSS as a line, over the history's window
// (GET /admin/history, one sample a second). Drawn by uPlot (window.uPlot,
// loaded from /ui/uPlot.iife.min.js).
import { bytes, KINDS, RUNTIME_COLOR, RSS_COLOR } from './format.js';

const uPlot = window.uPlot;

// Stacked areas are cumulative sums drawn from the top layer down, each
// filled to zero, so each layer shows through above the one below it.
export class MemoryChart {
  constructor(el) {
    this.el = el;
    this.raw = [];  // per drawn series, the unstacked values (legend shows them)
    // Top layer first: runtime, then the kinds in reverse, then RSS.
    this.layers = [{ key: 'runtime', label: 'runtime own', color: RUNTIME_COLOR },
      ...KINDS.slice().reverse().map(([key, label, color]) => ({ key, label, color }))];
    // The legend shows the hovered sample's unstacked bytes, else the latest.
    const value = (u, v, sidx, didx) => {
      const r = this.raw[sidx - 1];
      if (!r || !r.length) return '—';
      return bytes(r[didx ?? r.length - 1]);
    };
    const series = [{ label: 'time', value: (u, v) => (v == null ? '—' : new Date(v * 1000).toLocaleTimeString([], { hour12: false })) },
      ...this.layers.map(l => ({ label: l.label, stroke: l.color, fill: `${l.color}cc`, width: 1, value, points: { show: false } })),
      { label: 'measured RSS', stroke: RSS_COLOR, width: 2, dash: [6, 4], value, points: { show: false } }];
    this.plot = new uPlot({
      width: this.width(), height: 260, series,
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max * 1.08, 1)] } },
      axes: [{ stroke: '#6b7280', grid: { stroke: '#e5e7eb' } },
        { stroke: '#6b7280', grid: { stroke: '#e5e7eb' }, size: 70, values: (u, vals) => vals.map(v => bytes(v)) }],
      cursor: { drag: { x: false, y: false } },
    }, [[], ...series.slice(1).map(() => [])], el);
    new ResizeObserver(() => this.plot.setSize({ width: this.width(), height: 260 })).observe(el);
  }

  width() { return Math.max(280, this.el.clientWidth); }

  // `kinds`: the history's kind names (order of each sample's by_kind).
  update(samples, kinds) {
    const xs = samples.map(s => s.t / 1000);
    const index = Object.fromEntries(kinds.map((k, i) => [k, i]));
    const rawOf = l => samples.map(s => (l.key === 'runtime' ? s.runtime : s.by_kind[index[l.key]] ?? 0));
    // Bottom-up cumulative sums, then reversed to the drawing order.
    const bottomUp = this.layers.slice().reverse();
    const raw = bottomUp.map(rawOf);
    const stacked = [];
    let acc = samples.map(() => 0);
    for (const r of raw) {
      acc = acc.map((a, i) => a + r[i]);
      stacked.push(acc);
    }
    stacked.reverse();
    raw.reverse();
    const rss = samples.map(s => s.rss || null);
    this.raw = [...raw, samples.map(s => s.rss)];
    this.plot.setData([xs, ...stacked, rss]);
  }
}
