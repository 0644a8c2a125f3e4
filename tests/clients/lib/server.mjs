// Starting the real `arbiter serve` for the Node client tests (run by
// `node --test` from CTest through run-node-tests.sh): a free loopback
// port, a fresh state directory (the demo models are generated into it),
// the log in a file, a wait for /health, and a stop that SIGTERMs the
// server and removes the state.
//
//   const server = await startServer();            // demo models
//   const client = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'x' });
//   ...
//   await server.stop();
//
// ARBITER_BIN names the binary (set by CTest).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

export async function startServer({ args = [], config = null, waitSeconds = 600 } = {}) {
  const bin = process.env.ARBITER_BIN;
  if (!bin) throw new Error('ARBITER_BIN is not set');
  const port = await freePort();
  const state = fs.mkdtempSync(path.join(os.tmpdir(), 'arbiter-node-test-'));
  const log = path.join(state, 'server.log');
  const extra = [...args];
  if (config !== null) {
    fs.writeFileSync(path.join(state, 'arbiter.toml'), config);
    extra.push('--config', path.join(state, 'arbiter.toml'));
  }
  const fd = fs.openSync(log, 'a');
  const child = spawn(bin, ['serve', '--host', '127.0.0.1', '--port', String(port),
                            '--state-dir', path.join(state, 'state'), ...extra],
                      { stdio: ['ignore', fd, fd] });
  fs.closeSync(fd);
  let exited = null;
  const exit = new Promise(resolve => child.once('exit', (code, signal) => {
    exited = { code, signal };
    resolve(exited);
  }));
  const baseURL = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + waitSeconds * 1000;
  for (;;) {
    if (exited) throw new Error(`arbiter exited (${JSON.stringify(exited)}): ${tail(log)}`);
    try {
      const r = await fetch(`${baseURL}/health`);
      if (r.ok) break;
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`no /health within ${waitSeconds}s: ${tail(log)}`);
    }
    await new Promise(r => setTimeout(r, 100));
  }
  return {
    port,
    baseURL,
    log,
    async stop() {
      if (!exited) child.kill('SIGTERM');
      const killer = setTimeout(() => child.kill('SIGKILL'), 30000);
      await exit;
      clearTimeout(killer);
      fs.rmSync(state, { recursive: true, force: true });
    },
  };
}

function tail(file) {
  try { return fs.readFileSync(file, 'utf8').split('\n').slice(-5).join('\n'); } catch { return ''; }
}

// Polls `f` until it returns a truthy value or `seconds` pass.
export async function waitFor(f, seconds = 60, what = 'condition') {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise(r => setTimeout(r, 100));
  }
}
