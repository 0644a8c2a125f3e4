// Ollama's API through the official `ollama` npm client, unmodified
// (docs/http-api.md "Ollama compatibility"): list, ps, show, chat and
// generate (streaming and not), embed, keep_alive 0, and the 400 for an
// option arbiter does not implement. Run by `node --test` against the demo
// models of a server from ./lib/server.mjs.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Ollama } from 'ollama';
import { startServer } from './lib/server.mjs';

let server;
let ollama;

before(async () => {
  server = await startServer();
  ollama = new Ollama({ host: `http://127.0.0.1:${server.port}` });
});

after(async () => {
  await server?.stop();
});

// Polls `check` until it returns true or `ms` pass (no fixed sleeps).
async function waitFor(check, ms) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 100));
  }
}

test('list names the demo models with the :latest tag', async () => {
  const { models } = await ollama.list();
  const names = models.map((m) => m.name);
  assert.ok(names.includes('demo-chat:latest'), names.join(','));
  assert.ok(names.includes('demo-embed:latest'), names.join(','));
  for (const m of models) assert.match(m.digest, /^[0-9a-f]{64}$/);
});

test('chat, not streamed', async () => {
  const r = await ollama.chat({
    model: 'demo-chat',
    messages: [{ role: 'user', content: 'Hello' }],
    options: { num_predict: 8, seed: 7, temperature: 0 },
  });
  assert.equal(r.done, true);
  assert.equal(r.model, 'demo-chat:latest');
  assert.equal(r.message.role, 'assistant');
  assert.equal(typeof r.message.content, 'string');
  assert.ok(r.eval_count >= 1 && r.eval_count <= 8, `eval_count ${r.eval_count}`);
  assert.ok(r.prompt_eval_count > 0);
  assert.ok(['stop', 'length'].includes(r.done_reason));
  assert.ok(r.total_duration >= r.eval_duration);
});

test('chat, streamed: NDJSON parts end with done', async () => {
  const stream = await ollama.chat({
    model: 'demo-chat:latest',
    messages: [{ role: 'user', content: 'Hello' }],
    stream: true,
    options: { num_predict: 6, seed: 7, temperature: 0 },
  });
  const parts = [];
  for await (const part of stream) parts.push(part);
  assert.ok(parts.length >= 2, `${parts.length} parts`);
  const last = parts[parts.length - 1];
  assert.equal(last.done, true);
  assert.ok(parts.slice(0, -1).every((p) => p.done === false));
  const text = parts.map((p) => p.message.content).join('');
  // Same seed, greedy: the streamed text is the non-streamed one.
  const whole = await ollama.chat({
    model: 'demo-chat',
    messages: [{ role: 'user', content: 'Hello' }],
    options: { num_predict: 6, seed: 7, temperature: 0 },
  });
  assert.equal(text, whole.message.content);
});

test('generate, streamed and not', async () => {
  const r = await ollama.generate({
    model: 'demo-chat',
    prompt: 'Once upon a time',
    options: { num_predict: 5, temperature: 0 },
  });
  assert.equal(r.done, true);
  assert.equal(typeof r.response, 'string');
  assert.ok(r.eval_count <= 5);
  const stream = await ollama.generate({
    model: 'demo-chat',
    prompt: 'Once upon a time',
    stream: true,
    options: { num_predict: 5, temperature: 0 },
  });
  let text = '';
  let done = false;
  for await (const part of stream) {
    text += part.response;
    done = part.done;
  }
  assert.equal(done, true);
  assert.equal(text, r.response);
});

test('format: json and a JSON schema give output that parses, and tools give tool_calls', async () => {
  const j = await ollama.chat({
    model: 'demo-chat', format: 'json', messages: [{ role: 'user', content: 'json' }],
    options: { num_predict: 30, seed: 3 },
  });
  assert.equal(typeof JSON.parse(j.message.content), 'object');
  const schema = { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } },
                   required: ['city', 'days'] };
  const g = await ollama.generate({ model: 'demo-chat', prompt: 'a trip', format: schema,
                                    options: { num_predict: 60, seed: 4 } });
  const o = JSON.parse(g.response);
  assert.equal(typeof o.city, 'string');
  assert.ok(Number.isInteger(o.days), g.response);
  // Ollama has no tool_choice: with the random demo model a call is not
  // guaranteed, but whatever comes back is well-formed.
  const t = await ollama.chat({
    model: 'demo-chat', messages: [{ role: 'user', content: 'weather in Paris?' }],
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'weather',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }],
    options: { num_predict: 16 },
  });
  for (const c of t.message.tool_calls ?? []) assert.equal(typeof c.function.arguments, 'object');
});

test('embed: one vector per input', async () => {
  const r = await ollama.embed({ model: 'demo-embed', input: ['first text', 'second text'] });
  assert.equal(r.embeddings.length, 2);
  assert.ok(r.embeddings[0].length > 0);
  const norm = Math.hypot(...r.embeddings[0]);
  assert.ok(Math.abs(norm - 1) < 1e-3, `norm ${norm}`);
});

test('show and ps', async () => {
  const s = await ollama.show({ model: 'demo-chat' });
  assert.ok(s.capabilities.includes('completion'));
  assert.ok(s.details.format.length > 0);
  await ollama.generate({ model: 'demo-chat', prompt: 'hi', options: { num_predict: 1 } });
  const { models } = await ollama.ps();
  const chat = models.find((m) => m.name === 'demo-chat:latest');
  assert.ok(chat, JSON.stringify(models));
  assert.ok(chat.size > 0);
  assert.equal(chat.size_vram, 0);
  assert.ok(!Number.isNaN(Date.parse(chat.expires_at)), chat.expires_at);
});

test('keep_alive 0 unloads the model after the request', async () => {
  await ollama.chat({
    model: 'demo-chat',
    messages: [{ role: 'user', content: 'Hello' }],
    options: { num_predict: 2 },
    keep_alive: 0,
  });
  const gone = await waitFor(async () => {
    const { models } = await ollama.ps();
    return !models.some((m) => m.name === 'demo-chat:latest');
  }, 10000);
  assert.ok(gone, 'demo-chat still in ps 10 s after keep_alive 0');
  // A later request loads it again (and, with keep_alive -1, keeps it).
  await ollama.generate({ model: 'demo-chat', prompt: 'hi', options: { num_predict: 1 },
                          keep_alive: -1 });
  const { models } = await ollama.ps();
  assert.ok(models.some((m) => m.name === 'demo-chat:latest'));
});

test('an option arbiter does not implement is a 400 naming it', async () => {
  await assert.rejects(
    ollama.chat({
      model: 'demo-chat',
      messages: [{ role: 'user', content: 'Hello' }],
      options: { mirostat: 2 },
    }),
    (e) => e.status_code === 400 && /mirostat/.test(e.message),
  );
  await assert.rejects(
    ollama.chat({ model: 'no-such-model', messages: [{ role: 'user', content: 'Hello' }] }),
    (e) => e.status_code === 404,
  );
});
