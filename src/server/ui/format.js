// Formatting for the dashboard: sizes with units, relative times, event
// summaries. Pure functions (no DOM).

const KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

// 1536 → "1.5 KiB", 167772160 → "160 MiB", 23665451008 → "22.0 GiB".
export function bytes(n) {
  if (n == null || Number.isNaN(n)) return '—';
  const sign = n < 0 ? '−' : '';
  const a = Math.abs(n);
  if (a >= GiB) return `${sign}${(a / GiB).toFixed(a >= 100 * GiB ? 0 : 1)} GiB`;
  if (a >= MiB) return `${sign}${(a / MiB).toFixed(a >= 100 * MiB ? 0 : 1)} MiB`;
  if (a >= KiB) return `${sign}${(a / KiB).toFixed(1)} KiB`;
  return `${sign}${a} B`;
}

// A duration in ms → "4 s", "3 min", "2 h 5 min", "3 d".
export function duration(ms) {
  if (ms == null) return '—';
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const h = Math.floor(m / 60);
  if (h < 48) return m % 60 ? `${h} h ${m % 60} min` : `${h} h`;
  return `${Math.floor(h / 24)} d`;
}

// A past unix-ms time relative to now: "just now", "12 s ago", "3 min ago".
export function ago(t, now = Date.now()) {
  const d = now - t;
  if (d < 1500) return 'just now';
  return `${duration(d)} ago`;
}

export function clock(t) {
  return new Date(t).toLocaleTimeString([], { hour12: false });
}

// The ledger's kinds, their labels and colours (also the chart's).
export const KINDS = [
  ['device_weights', 'device weights', '#3b6fd8'],
  ['host_floor', 'host floor', '#6aa2f0'],
  ['kv_slot', 'KV slots', '#2f9e6e'],
  ['prompt_cache', 'prompt cache', '#7cc79f'],
  ['vision_cache', 'vision cache', '#c08a2b'],
  ['scratch', 'scratch', '#9c6ad6'],
  ['model', 'model (backends)', '#d2645a'],
  ['other', 'other', '#8a8f98'],
];
export const RUNTIME_COLOR = '#c9ccd3';
export const RSS_COLOR = '#e0463c';

// One line describing an arbiter event (GET /admin/events data).
export function eventSummary(type, e) {
  const who = e.model_key ? `${e.model_key} (${e.capability})` : '';
  switch (type) {
    case 'model_load': return `${who} loaded in ${Math.round(e.load_ms)} ms`;
    case 'model_unload': return `${who} unloaded: ${e.reason}`;
    case 'eviction': return `${who} evicted (${e.reason}), ~${bytes(e.estimated_bytes)}`;
    case 'memory_pressure':
      return `pressure → ${e.level} (${e.source}${e.free_bytes != null ? `, ${bytes(e.free_bytes)} free` : ''})`;
    case 'capability_run': return `${who} ran in ${Math.round(e.run_ms)} ms`;
    default: return JSON.stringify(e);
  }
}
