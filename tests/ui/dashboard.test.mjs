// The dashboard (GET /ui, docs/ui.md) in a real browser: Debian's Chromium
// driven by playwright-core, against the real `arbiter serve` with the demo
// models. Waits for elements, never for network idleness (the page holds an
// event stream open). Any console error or page error fails the test.
// Screenshots go to UI_SCREENSHOT_DIR (CTest: build/tests/ui-screenshots).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { startServer } from './lib/server.mjs';

const shots = process.env.UI_SCREENSHOT_DIR || path.resolve('screenshots');
fs.mkdirSync(shots, { recursive: true });
const KEY = 'dashboard-test-key-3f9c1a';

let browser;
before(async () => {
  browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
});
after(async () => { await browser?.close(); });

// A page that records console errors and page errors.
async function openPage(viewport) {
  const context = await browser.newContext({ viewport });
  const page = await context.newPage();
  const errors = [];
  page.on('console', m => { if (m.type() === 'error') errors.push(`${m.text()} @ ${m.location().url}`); });
  page.on('pageerror', e => errors.push(String(e)));
  return { page, context, errors };
}

const row = (page, model) => page.locator(`#models tr[data-model="${model}"]`);

async function post(server, p, body, key) {
  const headers = { 'Content-Type': 'application/json' };
  if (key) headers.Authorization = `Bearer ${key}`;
  const r = await fetch(`${server.baseURL}${p}`, { method: 'POST', headers, body: JSON.stringify(body) });
  const text = await r.text();
  assert.equal(r.status, 200, `${p}: ${text}`);
  return JSON.parse(text);
}

// Confirms the open <dialog> with the keyboard's Enter (focus is on its
// confirm button).
async function confirm(page) {
  const dialog = page.locator('dialog#confirm');
  await dialog.waitFor({ state: 'visible' });
  await page.keyboard.press('Enter');
  await dialog.waitFor({ state: 'hidden' });
}

test('the demo stack live: render, a chat fills a slot, critical pressure from the page, unload', async () => {
  const server = await startServer();
  const { page, context, errors } = await openPage({ width: 1280, height: 800 });
  try {
    await page.goto(`${server.baseURL}/ui`, { waitUntil: 'domcontentloaded' });
    // Models, budget, slots and pressure render.
    for (const m of ['demo-chat', 'demo-embed', 'asr', 'tts', 'ocr', 'vad']) {
      await row(page, m).waitFor();
    }
    await assert.doesNotReject(page.locator('#budget .figures').waitFor());
    assert.match(await page.locator('#budget').innerText(), /Budget\s+[\d.]+ (MiB|GiB)/);
    // One budget bar per memory domain: a CPU-only server has the host's alone.
    assert.equal(await page.locator('#budget .bar[data-domain]').count(), 1);
    assert.equal(await page.locator('#budget .bar[data-domain="host"]').count(), 1);
    assert.match(await row(page, 'demo-chat').innerText(), /not loaded/);
    await page.locator('#kv .slot').first().waitFor();
    assert.match(await page.locator('#pressure-badge').innerText(), /nominal/);
    assert.match(await row(page, 'demo-embed').innerText(), /embedding \(25\)/);

    // A chat request: the model becomes resident and its slot fills.
    await post(server, '/v1/chat/completions', {
      model: 'demo-chat', conversation_id: 'ui-test-conv', max_tokens: 4,
      messages: [{ role: 'user', content: 'hello from the browser test' }],
    });
    await row(page, 'demo-chat').getByText(/resident|held/).waitFor({ timeout: 5000 });
    await page.locator('#kv .slot', { hasText: 'conversation ui-test-conv' }).waitFor({ timeout: 6000 });
    const tokens = Number((await page.locator('#kv .slot', { hasText: 'ui-test-conv' }).locator('.slot-tokens').innerText()).split(' ')[0]);
    assert.ok(tokens > 0, `slot tokens ${tokens}`);
    await page.locator('#events li', { hasText: 'demo-chat (text) loaded' }).waitFor({ timeout: 5000 });

    // The embedding model loads, then critical pressure from the page
    // evicts it and the level changes, both within 2 s.
    await post(server, '/v1/embeddings', { model: 'demo-embed', input: 'a sentence' });
    await row(page, 'demo-embed').getByText('resident').waitFor({ timeout: 5000 });
    await page.locator('#next-victim', { hasText: 'demo-embed' }).waitFor({ timeout: 5000 });
    await page.screenshot({ path: path.join(shots, 'dashboard-1280.png'), fullPage: true });
    await page.selectOption('#pressure-level', 'critical');
    await page.click('#pressure-send');
    const t0 = Date.now();
    await confirm(page);
    await page.locator('#pressure-badge', { hasText: 'critical' }).waitFor({ timeout: 2000 });
    await row(page, 'demo-embed').getByText('not loaded').waitFor({ timeout: Math.max(100, 2000 - (Date.now() - t0)) });
    assert.ok(Date.now() - t0 <= 2000, `pressure shown after ${Date.now() - t0} ms`);
    await page.locator('#events li', { hasText: 'demo-embed (embedding) evicted (pressure)' }).first().waitFor();
    await page.locator('#events li', { hasText: 'demo-embed (embedding) unloaded: pressure' }).first().waitFor();
    await page.locator('#events li', { hasText: 'pressure → critical' }).first().waitFor();
    await page.screenshot({ path: path.join(shots, 'dashboard-critical-1280.png'), fullPage: true });
    await page.selectOption('#pressure-level', 'nominal');
    await page.click('#pressure-send');
    await confirm(page);
    await page.locator('#pressure-badge', { hasText: 'nominal' }).waitFor({ timeout: 2000 });

    // Cancelling a confirmation does nothing (Escape closes the dialog).
    await page.locator('#compact').focus();
    await page.keyboard.press('Enter');
    await page.locator('dialog#confirm').waitFor({ state: 'visible' });
    await page.keyboard.press('Escape');
    await page.locator('dialog#confirm').waitFor({ state: 'hidden' });

    // Unload demo-chat from the page (load it first if critical evicted it).
    let status = await (await fetch(`${server.baseURL}/admin/status`)).json();
    if (status.models.find(m => m.name === 'demo-chat').state !== 'loaded') {
      await row(page, 'demo-chat').getByRole('button', { name: 'Load' }).click();
      await confirm(page);
      await row(page, 'demo-chat').getByText(/resident/).waitFor({ timeout: 10000 });
    }
    await row(page, 'demo-chat').getByRole('button', { name: 'Unload' }).click();
    await confirm(page);
    await row(page, 'demo-chat').getByText('not loaded').waitFor({ timeout: 10000 });
    status = await (await fetch(`${server.baseURL}/admin/status`)).json();
    assert.equal(status.models.find(m => m.name === 'demo-chat').state, 'ready');
    await page.locator('#events li', { hasText: 'demo-chat (text) unloaded: manual' }).first().waitFor();

    // The history chart drew: uPlot's canvas is there, sized.
    const canvas = await page.locator('#chart canvas').boundingBox();
    assert.ok(canvas && canvas.width > 300 && canvas.height > 100, JSON.stringify(canvas));

    // Keyboard: the first Tab reaches the skip link, and every action is a
    // focusable native control.
    await page.reload({ waitUntil: 'domcontentloaded' });
    await row(page, 'demo-chat').waitFor();
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement?.className), 'skip');
    // Tabbing on reaches the model actions as native buttons.
    const reached = [];
    for (let i = 0; i < 12; i++) {
      await page.keyboard.press('Tab');
      reached.push(await page.evaluate(() => `${document.activeElement?.tagName}:${document.activeElement?.textContent}`));
    }
    assert.ok(reached.includes('BUTTON:Load'), reached.join(' '));
    assert.deepEqual(errors, []);
  } finally {
    await context.close();
    await server.stop();
  }
});

test('a phone-width screen (390 px) shows every section without sideways scrolling', async () => {
  const server = await startServer();
  const { page, context, errors } = await openPage({ width: 390, height: 844 });
  try {
    await post(server, '/v1/chat/completions', {
      model: 'demo-chat', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
    await page.goto(`${server.baseURL}/ui`, { waitUntil: 'domcontentloaded' });
    await row(page, 'demo-chat').getByText('resident').waitFor();
    await page.locator('#kv .slot').first().waitFor();
    await page.locator('#events li').first().waitFor();
    const widths = await page.evaluate(() => ({ doc: document.documentElement.scrollWidth, win: window.innerWidth }));
    assert.ok(widths.doc <= widths.win, `page is ${widths.doc} px wide in a ${widths.win} px window`);
    await page.screenshot({ path: path.join(shots, 'dashboard-390.png'), fullPage: true });
    assert.deepEqual(errors, []);
  } finally {
    await context.close();
    await server.stop();
  }
});

test('with an API key the page signs in with a session cookie, never the key in a URL', async () => {
  const server = await startServer({ args: ['--api-key', KEY] });
  const { page, context, errors } = await openPage({ width: 1280, height: 800 });
  const urls = [];
  page.on('request', r => urls.push(r.url()));
  try {
    await page.goto(`${server.baseURL}/ui`, { waitUntil: 'domcontentloaded' });
    await page.locator('#login-key').waitFor();
    assert.equal(await page.locator('#main').isHidden(), true);
    // A wrong key: an error message, still signed out.
    await page.fill('#login-key', 'not-the-key');
    await page.keyboard.press('Enter');
    await page.locator('#login-error', { hasText: 'not the API key' }).waitFor();
    // The right key: the dashboard opens and its live stream connects.
    await page.fill('#login-key', KEY);
    await page.keyboard.press('Enter');
    await row(page, 'demo-chat').waitFor();
    await page.locator('#live', { hasText: 'live' }).waitFor();
    const cookies = await context.cookies();
    const session = cookies.find(c => c.name === 'arbiter_session');
    assert.ok(session, JSON.stringify(cookies));
    assert.equal(session.httpOnly, true);
    assert.equal(session.sameSite, 'Strict');
    assert.equal(await page.evaluate(() => document.cookie), '');  // HttpOnly: no script sees it
    assert.ok(urls.every(u => !u.includes(KEY)), 'the key appeared in a URL');
    // An admin action through the cookie works; without it the API is closed.
    await page.selectOption('#pressure-level', 'low');
    await page.click('#pressure-send');
    await confirm(page);
    await page.locator('#pressure-badge', { hasText: 'low' }).waitFor({ timeout: 2000 });
    assert.equal((await fetch(`${server.baseURL}/admin/status`)).status, 401);
    // Another origin cannot use the cookie (a same-site page on another port).
    const r = await fetch(`${server.baseURL}/admin/pressure`, { method: 'POST',
      headers: { Cookie: `arbiter_session=${session.value}`, Origin: 'http://127.0.0.1:1', 'Content-Type': 'text/plain' },
      body: '{"level":"critical"}' });
    assert.equal(r.status, 401);
    // Signing out ends the session.
    await page.click('#logout');
    await page.locator('#login-key').waitFor();
    const after = await fetch(`${server.baseURL}/admin/status`, { headers: { Cookie: `arbiter_session=${session.value}` } });
    assert.equal(after.status, 401);
    // The only console error is the browser's own line for the wrong key's 401.
    assert.deepEqual(errors.filter(e => !/status of 401.*\/ui\/login/.test(e)), []);
  } finally {
    await context.close();
    await server.stop();
  }
});
