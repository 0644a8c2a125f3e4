// The dashboard's views: each renders one snapshot into its section. Text
// goes in through textContent only (names come from the server's config and
// requests). Views keep keyboard focus across refreshes: an element with a
// data-key that had focus gets it back after a re-render.
import { bytes, duration, ago, clock, KINDS, RUNTIME_COLOR, eventSummary } from './format.js';

// h('td', {class: 'num'}, 'text', child...) → element.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'style') Object.assign(el.style, v);
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// Replaces `container`'s children with `nodes`, keeping focus on the
// element with the same data-key.
export function replaceKeepingFocus(container, nodes) {
  const active = document.activeElement;
  const key = active && container.contains(active) ? active.dataset.key : null;
  container.replaceChildren(...nodes.filter(n => n != null));
  if (key) container.querySelector(`[data-key="${CSS.escape(key)}"]`)?.focus();
}

function segment(width, color, title, cls = '') {
  return h('span', { class: `seg ${cls}`, title, style: { width: `${width}%`, background: color } });
}

// The budget: the ledger by kind against the budget, and the ledger plus
// the runtime's own bytes against the measured RSS (unaccounted visible).
export function renderBudget(el, st) {
  const kinds = KINDS.map(([k, label, color]) => ({ k, label, color, b: st.charged_by_kind[k] || 0 }));
  const charged = st.charged_bytes, runtime = st.runtime_bytes, rss = st.process_resident_bytes;
  const budget = st.budget_bytes;
  const unaccounted = st.unaccounted_bytes;
  const pct = (b, of) => (of > 0 ? Math.max(0, Math.min(100, (100 * b) / of)) : 0);

  const budgetBar = h('div', { class: 'bar', role: 'img', dataset: { domain: 'host' },
    'aria-label': `charged ${bytes(charged)} of a ${budget ? bytes(budget) : 'unlimited'} budget` },
    kinds.filter(x => x.b > 0).map(x => segment(pct(x.b, budget || charged), x.color, `${x.label}: ${bytes(x.b)}`)));

  // One budget bar per device memory domain (the host's is the bar above;
  // docs/memory.md "Memory domains").
  const devices = Object.entries(st.domains || {}).filter(([name]) => name !== 'host');
  const deviceBars = devices.flatMap(([name, d]) => {
    const of = d.budget_bytes || d.charged_bytes;
    const text = `${name}${d.inside_host ? ' (host memory)' : ''}: ${bytes(d.charged_bytes)} of ` +
      `${d.budget_bytes ? bytes(d.budget_bytes) : 'unlimited'}` +
      `${d.runtime_bytes ? `, device runtime ${bytes(d.runtime_bytes)}` : ''}`;
    return [h('p', { class: 'bar-label' }, text),
      h('div', { class: 'bar', role: 'img', dataset: { domain: name }, 'aria-label': text },
        KINDS.map(([k, label, color]) => [label, color, d.by_kind?.[k] || 0]).filter(([, , b]) => b > 0)
          .map(([label, color, b]) => segment(pct(b, of), color, `${label}: ${bytes(b)}`)))];
  });

  const scale = Math.max(rss, charged + runtime + Math.max(0, unaccounted), 1);
  const rssBar = h('div', { class: 'bar', role: 'img',
    'aria-label': `ledger ${bytes(charged + runtime)} against measured RSS ${bytes(rss)}` },
    kinds.filter(x => x.b > 0).map(x => segment(pct(x.b, scale), x.color, `${x.label}: ${bytes(x.b)}`)),
    runtime > 0 ? segment(pct(runtime, scale), RUNTIME_COLOR, `runtime's own: ${bytes(runtime)}`) : null,
    unaccounted > 0 ? segment(pct(unaccounted, scale), 'transparent', `unaccounted: ${bytes(unaccounted)}`, 'unaccounted') : null,
    rss > 0 ? h('span', { class: 'marker', title: `measured RSS ${bytes(rss)}`, style: { left: `${pct(rss, scale)}%` } }) : null);

  const figures = h('dl', { class: 'figures' },
    h('div', {}, h('dt', {}, 'Budget'), h('dd', {}, budget ? bytes(budget) : 'unlimited')),
    h('div', {}, h('dt', {}, 'Charged'), h('dd', {}, `${bytes(charged)}${budget ? ` (${(100 * charged / budget).toFixed(1)} %)` : ''}`)),
    h('div', {}, h('dt', {}, 'Runtime own'), h('dd', {}, bytes(runtime))),
    h('div', {}, h('dt', {}, 'Measured RSS'), h('dd', {}, bytes(rss))),
    h('div', { class: Math.abs(unaccounted) > 64 * 1048576 ? 'warn' : '' },
      h('dt', {}, 'Unaccounted'), h('dd', {}, bytes(unaccounted))),
    st.over_budget_bytes > 0 ? h('div', { class: 'warn' }, h('dt', {}, 'Over budget'), h('dd', {}, bytes(st.over_budget_bytes))) : null);

  const legend = h('ul', { class: 'legend' },
    kinds.map(x => h('li', { class: x.b ? '' : 'zero' }, h('span', { class: 'swatch', style: { background: x.color } }),
      `${x.label} `, h('b', {}, bytes(x.b)))),
    h('li', {}, h('span', { class: 'swatch', style: { background: RUNTIME_COLOR } }), 'runtime own ', h('b', {}, bytes(runtime))),
    h('li', {}, h('span', { class: 'swatch unaccounted' }), 'unaccounted ', h('b', {}, bytes(unaccounted))));

  el.replaceChildren(figures,
    h('p', { class: 'bar-label' }, devices.length ? 'host: ledger against the budget' : 'Ledger against the budget'), budgetBar,
    ...deviceBars,
    h('p', { class: 'bar-label' }, 'Ledger + runtime against measured RSS (red line)'), rssBar, legend);
}

function stateText(m) {
  switch (m.state) {
    case 'ready': return 'not loaded';
    case 'loading': return 'loading…';
    case 'failed': return 'failed';
    case 'loaded': return m.ref_count > 0 ? `held (${m.ref_count} ref${m.ref_count > 1 ? 's' : ''})` : 'resident';
    default: return m.state;
  }
}

function tierText(m) {
  if (m.state !== 'loaded') return m.weight_bytes != null ? 'file' : '—';
  if (m.device_resident) return 'device';
  if (m.host_resident) return 'host floor';
  if (m.weight_bytes != null) return 'file';
  return m.process ? 'process' : 'memory';
}

// Models: one row per configured model, rows kept across refreshes (their
// buttons keep focus). `act(kind, model, arg)` runs an action.
export function renderModels(table, st, act) {
  const tbody = table.tBodies[0];
  const rows = new Map([...tbody.rows].map(r => [r.dataset.model, r]));
  const victim = st.next_victim?.model;
  const seen = new Set();
  for (const m of st.models) {
    seen.add(m.name);
    let r = rows.get(m.name);
    if (!r) {
      r = h('tr', { dataset: { model: m.name } });
      const labels = [...table.tHead.rows[0].cells].map(c => c.textContent);
      for (let i = 0; i < 8; i++) r.append(h('td', { dataset: { label: labels[i] } }));
      r.cells[5].className = 'num';
      const load = h('button', { type: 'button', dataset: { key: `load:${m.name}` }, onclick: () => act('load', m.name) }, 'Load');
      const unload = h('button', { type: 'button', dataset: { key: `unload:${m.name}` }, onclick: () => act('unload', m.name) }, 'Unload');
      r.cells[7].append(load, unload);
      if (m.residency != null) {
        const sel = h('select', { 'aria-label': `residency of ${m.name}`, dataset: { key: `residency:${m.name}` } },
          ['unpinned', 'pinned_system', 'pinned_device'].map(v => h('option', { value: v }, v.replace('_', ' '))));
        sel.addEventListener('change', () => act('residency', m.name, sel.value));
        r.cells[7].append(sel);
      }
      tbody.append(r);
    }
    const c = r.cells;
    c[0].replaceChildren(h('span', { class: 'name' }, m.name), m.engine ? h('span', { class: 'sub' }, m.engine) : '',
      m.name === victim ? h('span', { class: 'badge victim', title: st.next_victim.reason }, 'next victim') : '');
    c[1].textContent = m.capability;
    c[2].textContent = `${m.role} (${m.priority})`;
    c[3].replaceChildren(h('span', { class: `state state-${m.state}${m.ref_count > 0 ? ' held' : ''}`, title: m.error || '' }, stateText(m)),
      m.error ? h('span', { class: 'sub error' }, m.error) : '');
    c[4].textContent = tierText(m);
    c[5].textContent = `${m.bytes_measured ? '' : '~'}${bytes(m.bytes)}`;
    c[5].title = m.bytes_measured ? 'measured' : 'estimate (measured after the first load)';
    const ttl = m.idle_ttl_ms == null ? 'TTL never' : `TTL ${duration(m.idle_ttl_ms)}`;
    c[6].textContent = m.state !== 'loaded' ? ttl
      : m.ref_count > 0 || m.running ? `in use · ${ttl}` : `idle ${duration(m.idle_ms)} · ${ttl}`;
    const [load, unload, sel] = c[7].children;
    load.disabled = m.state === 'loaded' || m.state === 'loading';
    unload.disabled = m.state !== 'loaded';
    if (sel && document.activeElement !== sel) sel.value = m.residency;
    r.classList.toggle('is-victim', m.name === victim);
  }
  for (const [name, r] of rows) if (!seen.has(name)) r.remove();
}

export function renderNextVictim(el, st) {
  const v = st.next_victim;
  el.textContent = v
    ? `Next to go when memory is needed: ${v.model} (${v.role}, ${bytes(v.bytes)}): ${v.reason}.`
    : 'Next to go when memory is needed: none — no idle model that fit or pressure may evict is resident ' +
      '(text targets are evicted only by critical pressure).';
}

// KV: slots per text model, conversations (closable), the prompt cache and
// the KV files on disk by TTL class.
export function renderKv(el, kv, act) {
  const nodes = [];
  for (const m of kv.models) {
    const slots = h('ul', { class: 'slots' }, m.slots.map(s => {
      const fill = m.ctx ? Math.min(100, (100 * s.n_tokens) / m.ctx) : 0;
      return h('li', { class: `slot${s.busy ? ' busy' : ''}`, title: `slot ${s.index}: ${s.n_tokens} tokens${m.ctx ? ` of ${m.ctx}` : ''}` },
        h('span', { class: 'slot-head' }, `slot ${s.index}`, s.busy ? h('span', { class: 'badge' }, 'busy') : ''),
        h('span', { class: 'slot-conv' }, s.conversation_id ? `conversation ${s.conversation_id}` : 'no conversation'),
        h('span', { class: 'meter', 'aria-hidden': 'true' }, h('span', { style: { width: `${fill}%` } })),
        h('span', { class: 'slot-tokens' }, `${s.n_tokens} tokens${m.ctx ? ` / ${m.ctx}` : ''}`));
    }));
    const convs = m.conversations.length
      ? h('ul', { class: 'convs' }, m.conversations.map(c => h('li', {},
          h('span', {}, `${c.conversation_id} · slot ${c.slot} · TTL ${duration(c.ttl_ms)}`),
          h('button', { type: 'button', class: 'small', dataset: { key: `close:${m.name}:${c.conversation_id}` },
            onclick: () => act('close', c.conversation_id, m.name) }, 'Close…'))))
      : h('p', { class: 'note' }, 'No open conversations.');
    const k = m.counters;
    nodes.push(h('div', { class: 'kv-model' },
      h('h3', {}, m.name),
      h('p', { class: 'note' }, `${k.requests} requests · ${k.cached_tokens} of ${k.prompt_tokens} prompt tokens from cache · ` +
        `${k.slot_hits} slot hits · ${k.prompt_cache_hits} prompt-cache hits · ${k.disk_hits} disk hits`),
      slots, h('h4', {}, 'Conversations'), convs));
  }
  if (!kv.models.length) nodes.push(h('p', { class: 'note' }, 'No text model with a KV cache is configured.'));
  const pc = kv.prompt_cache;
  if (pc) {
    nodes.push(h('h3', {}, 'Prompt cache'),
      h('p', { class: 'note' }, `${pc.entries.length} entries · ${bytes(pc.bytes)} of ${bytes(pc.capacity_bytes)} · ` +
        `${pc.hits} hits · ${pc.misses} misses`),
      pc.entries.length ? h('ul', { class: 'plain' }, pc.entries.slice(0, 20).map(e =>
        h('li', {}, `${e.model} · ${e.conversation_id || 'no conversation'} · ${e.n_tokens} tokens · ` +
          `${bytes(e.bytes)} · ${e.ttl_class} · ${duration(e.age_ms)} old`))) : null);
  }
  const byTtl = {};
  for (const f of kv.files) {
    const t = byTtl[f.ttl_class] ??= { n: 0, b: 0 };
    t.n++; t.b += f.bytes;
  }
  nodes.push(h('h3', {}, 'KV files on disk'),
    h('p', { class: 'note' }, `${kv.files_total} files · ${bytes(kv.disk_bytes)} of ${bytes(kv.disk_budget_bytes)}`),
    h('ul', { class: 'plain' }, Object.keys(kv.ttl_ms).map(c =>
      h('li', {}, `${c} (TTL ${duration(kv.ttl_ms[c])}): ${byTtl[c]?.n ?? 0} files, ${bytes(byTtl[c]?.b ?? 0)}`))));
  replaceKeepingFocus(el, nodes);
}

// The pressure level now and its timeline over the history's window.
export function renderPressure(badge, now, timeline, level, source, samples, windowMs) {
  badge.textContent = `pressure: ${level}`;
  badge.className = `badge level-${level}`;
  now.replaceChildren('Level ', h('b', { class: `level-text level-${level}` }, level),
    source ? ` · source: ${source}` : '');
  const end = Date.now(), start = end - windowMs;
  const runs = [];
  for (const s of samples) {
    if (s.t < start) continue;
    const last = runs[runs.length - 1];
    if (last && last.level === s.pressure) last.to = s.t;
    else runs.push({ level: s.pressure, from: s.t, to: s.t });
  }
  if (runs.length) runs[runs.length - 1].to = end;
  timeline.replaceChildren(...runs.map((r, i) => {
    const from = i === 0 ? r.from : runs[i - 1].to;
    const w = (100 * (r.to - from)) / windowMs;
    return h('span', { class: `tl level-${r.level}`, title: `${r.level} ${clock(from)}–${clock(r.to)}`,
      style: { width: `${Math.max(w, 0.2)}%` } });
  }));
  const first = runs[0];
  if (first) timeline.style.paddingLeft = `${Math.max(0, (100 * (first.from - start)) / windowMs)}%`;
}

// Events, newest first, filtered by type and text.
export function renderEvents(list, count, events, type, text) {
  const q = text.trim().toLowerCase();
  const shown = [];
  for (let i = events.length - 1; i >= 0; i--) {
    const e = events[i];
    if (type && e.type !== type) continue;
    if (q && !e.summary.toLowerCase().includes(q)) continue;
    shown.push(e);
  }
  count.textContent = `${shown.length} of ${events.length} events (the server keeps the last 1,000)`;
  list.replaceChildren(...shown.map(eventItem));
}

export function eventItem(e) {
  return h('li', { class: `ev ev-${e.type}` },
    h('time', { datetime: new Date(e.t).toISOString(), title: clock(e.t), dataset: { t: e.t } }, ago(e.t)),
    h('span', { class: 'badge' }, e.type), h('span', {}, e.summary));
}

export function makeEvent(t, type, data) {
  return { t, type, data, summary: eventSummary(type, data) };
}
