// The dashboard's controller (docs/ui.md): signs in when the server has an
// API key, loads the 10-minute history, then follows the server live —
// arbiter events over GET /admin/events (SSE) plus a snapshot of
// /admin/status every 2 s and /admin/kv every 4 s (and right after each
// event) — and runs the actions, each after a confirmation.
import { ago, bytes } from './format.js';
import { renderBudget, renderModels, renderNextVictim, renderKv, renderPressure, renderEvents,
  eventItem, makeEvent } from './views.js';
import { MemoryChart } from './charts.js';

const $ = id => document.getElementById(id);
const STATUS_MS = 2000, KV_MS = 4000, WINDOW_MS = 10 * 60 * 1000, MAX_EVENTS = 1000;
const EVENT_TYPES = ['model_load', 'model_unload', 'eviction', 'memory_pressure', 'capability_run'];

const state = {
  status: null, kv: null, samples: [], kinds: [], events: [], lastSample: 0,
  source: null, chart: null, timers: [], pending: null, running: false, authRequired: false,
};

class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

const inflight = new Set();  // requests under way (sign-out waits for them)

async function api(path, options = {}) {
  const req = fetch(path, { credentials: 'same-origin', ...options,
    headers: options.body ? { 'Content-Type': 'application/json' } : {} });
  inflight.add(req);
  let res;
  try { res = await req; } finally { inflight.delete(req); }
  const text = await res.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch { body = null; }
  if (!res.ok) throw new HttpError(res.status, body?.error?.message || `${res.status} ${res.statusText}`);
  return body;
}

function toast(message, kind = 'info') {
  const t = $('toast');
  t.textContent = message;
  t.className = `toast show ${kind}`;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.className = 'toast'; }, 5000);
}

// A confirmation in a modal <dialog> (keyboard: Tab between the buttons,
// Enter confirms, Escape cancels).
function confirmAction(text, okLabel) {
  const d = $('confirm');
  $('confirm-text').textContent = text;
  $('confirm-ok').textContent = okLabel;
  d.returnValue = 'cancel';
  d.showModal();
  $('confirm-ok').focus();
  return new Promise(resolve => d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true }));
}

async function act(kind, name, arg) {
  const enc = encodeURIComponent;
  const plan = {
    load: [`Load ${name} now?`, 'Load', `/admin/models/${enc(name)}/load`, null],
    unload: [`Unload ${name}? Requests still holding it finish first (up to 10 s).`, 'Unload', `/admin/models/${enc(name)}/unload`, null],
    residency: [`Set the residency of ${name} to ${arg}?`, 'Set', `/admin/models/${enc(name)}/residency`, { target: arg }],
    close: [`Close conversation ${name}${arg ? ` on ${arg}` : ''}? Its KV state is saved to disk first.`, 'Close',
      `/admin/conversations/${enc(name)}/close${arg ? `?model=${enc(arg)}` : ''}`, null],
    compact: ['Compact the device arena? Idle weights are evicted and reloaded packed.', 'Compact', '/admin/compact', null],
    pressure: [`Dispatch "${arg}" memory pressure? This is what the OS monitor would send: critical evicts every idle model but text targets.`,
      'Dispatch', '/admin/pressure', { level: arg }],
  }[kind];
  const [question, ok, path, body] = plan;
  if (!(await confirmAction(question, ok))) {
    if (kind === 'residency') refreshStatus();  // put the select back
    return;
  }
  try {
    const r = await api(path, { method: 'POST', body: body ? JSON.stringify(body) : '' });
    toast(kind === 'pressure' ? `pressure dispatched: ${r.pressure}`
      : kind === 'compact' ? `compacted: ${bytes(r.freed_bytes)} freed` : `${ok}: ${name} done`, 'ok');
  } catch (e) {
    if (e.status === 401) return showLogin();
    toast(`${ok} failed: ${e.message}`, 'error');
  }
  refreshStatus();
  refreshKv();
}

// ---- snapshots ----

let statusBusy = false;
async function refreshStatus() {
  if (statusBusy || !state.running) return;
  statusBusy = true;
  try {
    const st = await api('/admin/status');
    state.status = st;
    renderBudget($('budget'), st);
    renderModels($('models'), st, act);
    renderNextVictim($('next-victim'), st);
    drawPressure();
    setLive(true);
  } catch (e) {
    handleError(e);
  } finally {
    statusBusy = false;
  }
}

async function refreshKv() {
  if (!state.running) return;
  try {
    state.kv = await api('/admin/kv');
    renderKv($('kv'), state.kv, act);
  } catch (e) {
    handleError(e);
  }
}

async function refreshHistory() {
  if (!state.running) return;
  try {
    const h = await api(`/admin/history${state.lastSample ? `?since=${state.lastSample}` : ''}`);
    state.kinds = h.kinds;
    if (!state.lastSample) {
      for (const e of h.events) state.events.push(makeEvent(e.t, e.type, e.event));
      drawEvents();
    }
    state.samples.push(...h.samples);
    if (h.samples.length) state.lastSample = h.samples[h.samples.length - 1].t;
    const cut = Date.now() - WINDOW_MS;
    while (state.samples.length && state.samples[0].t < cut) state.samples.shift();
    state.chart.update(state.samples, state.kinds);
    drawPressure();
  } catch (e) {
    handleError(e);
  }
}

function drawPressure() {
  const st = state.status;
  if (!st) return;
  renderPressure($('pressure-badge'), $('pressure-now'), $('pressure-timeline'), st.pressure,
    st.pressure_source, state.samples, WINDOW_MS);
}

function drawEvents() {
  renderEvents($('events'), $('event-count'), state.events, $('event-type').value, $('event-filter').value);
}

function setLive(ok, text) {
  const l = $('live');
  l.textContent = text || (ok ? 'live' : 'disconnected');
  l.className = `live ${ok ? 'ok' : 'down'}`;
}

function handleError(e) {
  if (e.status === 401) return showLogin();
  setLive(false, `disconnected: ${e.message}`);
}

// ---- live events ----

function openEvents() {
  state.source?.close();
  const es = new EventSource('/admin/events', { withCredentials: true });
  state.source = es;
  const onEvent = type => msg => {
    const data = JSON.parse(msg.data);
    const e = makeEvent(Date.now(), type, data);
    state.events.push(e);
    if (state.events.length > MAX_EVENTS) state.events.shift();
    if (type === 'memory_pressure' && state.status) {
      state.status.pressure = data.level;  // shown at once, before the next snapshot
      state.status.pressure_source = data.source;
      drawPressure();
    }
    const type_ = $('event-type').value, q = $('event-filter').value.trim().toLowerCase();
    if ((!type_ || type_ === type) && (!q || e.summary.toLowerCase().includes(q))) {
      $('events').prepend(eventItem(e));
      $('event-count').textContent = `${state.events.length} events (the server keeps the last 1,000)`;
    }
    // One snapshot right after a burst of events.
    clearTimeout(state.pending);
    state.pending = setTimeout(() => { refreshStatus(); refreshKv(); }, 100);
  };
  for (const t of EVENT_TYPES) es.addEventListener(t, onEvent(t));
  es.addEventListener('dropped', msg => toast(`${JSON.parse(msg.data).dropped} events were dropped (the page lagged)`));
  es.onopen = () => setLive(true);
  es.onerror = () => setLive(false, 'reconnecting…');  // EventSource retries by itself
}

// ---- sign-in ----

async function showLogin() {
  stop();
  $('main').hidden = true;
  $('login').hidden = false;
  $('login-key').focus();
  setLive(false, 'signed out');
}

async function signIn(ev) {
  ev.preventDefault();
  $('login-error').textContent = '';
  try {
    await api('/ui/login', { method: 'POST', body: JSON.stringify({ key: $('login-key').value }) });
    $('login-key').value = '';
    start();
  } catch (e) {
    $('login-error').textContent = e.status === 401 ? 'That is not the API key.' : e.message;
  }
}

// Stops polling and the stream first and lets the requests under way
// finish, so nothing is sent with an ended session.
async function signOut() {
  stop();
  await Promise.allSettled([...inflight]);
  await api('/ui/logout', { method: 'POST', body: '' }).catch(() => {});
  showLogin();
}

// ---- lifecycle ----

function stop() {
  state.running = false;
  clearTimeout(state.pending);
  state.source?.close();
  state.source = null;
  for (const t of state.timers) clearInterval(t);
  state.timers = [];
}

async function start() {
  stop();
  $('login').hidden = true;
  $('main').hidden = false;
  $('logout').hidden = !state.authRequired;
  state.running = true;
  if (!state.chart) state.chart = new MemoryChart($('chart'));
  state.samples = [];
  state.events = [];
  state.lastSample = 0;
  await Promise.all([refreshStatus(), refreshKv(), refreshHistory()]);
  if ($('main').hidden) return;  // signed out meanwhile
  openEvents();
  state.timers.push(setInterval(refreshStatus, STATUS_MS), setInterval(refreshKv, KV_MS),
    setInterval(refreshHistory, STATUS_MS),
    setInterval(() => {  // relative times
      for (const t of document.querySelectorAll('#events time')) t.textContent = ago(Number(t.dataset.t));
    }, 5000));
}

async function boot() {
  $('login-form').addEventListener('submit', signIn);
  $('logout').addEventListener('click', signOut);
  $('compact').addEventListener('click', () => act('compact', 'the device arena'));
  $('pressure-form').addEventListener('submit', ev => { ev.preventDefault(); act('pressure', '', $('pressure-level').value); });
  $('event-type').addEventListener('change', drawEvents);
  $('event-filter').addEventListener('input', drawEvents);
  const s = await api('/ui/session');
  state.authRequired = s.auth_required;
  if (s.auth_required && !s.signed_in) showLogin();
  else start();
}

boot();
