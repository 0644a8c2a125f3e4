// Issue 15 point 9: the OpenAI API surface through the official `openai`
// Node SDK, unmodified, against a real `arbiter serve` on the demo models:
// chat, streaming, tools with tool_choice "required", response_format
// json_schema (validated with Ajv), logprobs, n, embeddings,
// models.retrieve, responses.create (streaming and not), audio, and the
// 400s for fields arbiter does not implement. Run by CTest through
// run-node-tests.sh (`node --test`).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import Ajv from 'ajv';
import OpenAI, { toFile } from 'openai';

import { startServer } from './lib/server.mjs';

let server;
let client;
before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await server?.stop(); });

const trip = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 40 },
    days: { type: 'integer' },
    tags: { type: 'array', items: { type: 'string' }, maxItems: 3 },
  },
  required: ['city', 'days'],
  additionalProperties: false,
};
const weather = [{
  type: 'function',
  function: { name: 'get_weather', description: 'weather of a city',
              parameters: { type: 'object', properties: { city: { type: 'string' } },
                            required: ['city'] } },
}];

test('chat and streaming chat', async () => {
  const r = await client.chat.completions.create({
    model: 'demo-chat', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(r.object, 'chat.completion');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.equal(r.usage.completion_tokens, 8);
  let text = '', chunks = 0, usage = null;
  const s = await client.chat.completions.create({
    model: 'demo-chat', max_tokens: 8, stream: true, stream_options: { include_usage: true },
    messages: [{ role: 'user', content: 'hi' }] });
  for await (const c of s) {
    chunks++;
    text += c.choices[0]?.delta?.content ?? '';
    if (c.usage) usage = c.usage;
  }
  assert.ok(chunks >= 3, `chunks ${chunks}`);
  assert.equal(usage.completion_tokens, 8);
  assert.equal(typeof text, 'string');
});

test('response_format json_schema always validates, and sampling still varies', async () => {
  const validate = new Ajv().compile(trip);
  const outs = new Set();
  for (const seed of [1, 2, 3, 4]) {
    const r = await client.chat.completions.create({
      model: 'demo-chat', max_tokens: 60, temperature: 1, seed,
      messages: [{ role: 'user', content: 'Plan a trip' }],
      response_format: { type: 'json_schema', json_schema: { name: 'trip', schema: trip, strict: true } } });
    const text = r.choices[0].message.content;
    const o = JSON.parse(text);
    assert.ok(validate(o), `${text}: ${JSON.stringify(validate.errors)}`);
    outs.add(text);
  }
  assert.ok(outs.size >= 2, 'four seeds gave one output');
});

test('response_format json_object parses, even when max_tokens cuts it short', async () => {
  for (const max_tokens of [6, 40]) {
    const r = await client.chat.completions.create({
      model: 'demo-chat', max_tokens, temperature: 1, seed: max_tokens,
      messages: [{ role: 'user', content: 'json please' }], response_format: { type: 'json_object' } });
    const o = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof o, 'object');
  }
});

test('tools: tool_choice required gives a valid call; streamed as delta.tool_calls', async () => {
  const r = await client.chat.completions.create({
    model: 'demo-chat', max_tokens: 80, tools: weather, tool_choice: 'required',
    messages: [{ role: 'user', content: 'weather in Paris?' }] });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  const call = choice.message.tool_calls[0];
  assert.match(call.id, /^call_/);
  assert.equal(call.function.name, 'get_weather');
  assert.equal(typeof JSON.parse(call.function.arguments).city, 'string');
  // the call and its result go back into the conversation
  const r2 = await client.chat.completions.create({
    model: 'demo-chat', max_tokens: 4, tools: weather,
    messages: [{ role: 'user', content: 'weather in Paris?' }, choice.message,
               { role: 'tool', tool_call_id: call.id, content: '18C and sunny' }] });
  assert.equal(r2.object, 'chat.completion');
  const s = await client.chat.completions.create({
    model: 'demo-chat', max_tokens: 80, stream: true, tools: weather,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
    messages: [{ role: 'user', content: 'weather?' }] });
  let args = '', name = '', finish = '';
  for await (const c of s) {
    for (const d of c.choices[0]?.delta?.tool_calls ?? []) {
      name += d.function?.name ?? '';
      args += d.function?.arguments ?? '';
    }
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(name, 'get_weather');
  assert.equal(finish, 'tool_calls');
  assert.equal(typeof JSON.parse(args).city, 'string');
});

test('logprobs and n', async () => {
  const r = await client.chat.completions.create({
    model: 'demo-chat', max_tokens: 4, n: 2, seed: 9, logprobs: true, top_logprobs: 3,
    messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(r.choices.length, 2);
  for (const c of r.choices) {
    assert.equal(c.logprobs.content.length, 4);
    for (const t of c.logprobs.content) {
      assert.equal(t.top_logprobs.length, 3);
      assert.ok(t.logprob <= 0);
      assert.deepEqual(Buffer.from(t.bytes).length, t.bytes.length);
    }
  }
  assert.equal(r.usage.completion_tokens, 8);
  // with a seed, each choice is reproducible
  const again = await client.chat.completions.create({
    model: 'demo-chat', max_tokens: 4, n: 2, seed: 9, messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(again.choices[1].message.content, r.choices[1].message.content);
  const comp = await client.completions.create({ model: 'demo-chat', prompt: 'Once', max_tokens: 3, logprobs: 2 });
  assert.equal(comp.choices[0].logprobs.tokens.length, 3);
  assert.equal(Object.keys(comp.choices[0].logprobs.top_logprobs[0]).length, 2);
});

test('unsupported and out-of-range fields are 400s naming the field', async () => {
  const cases = [
    [{ presence_penalty: 9 }, 'presence_penalty'],
    [{ frequency_penalty: -2.5 }, 'frequency_penalty'],
    [{ logit_bias: { 5: 101 } }, 'logit_bias'],
    [{ functions: [{ name: 'f' }] }, 'functions'],
    [{ not_a_field: 1 }, 'not_a_field'],
  ];
  for (const [extra, field] of cases) {
    await assert.rejects(
      client.chat.completions.create({ model: 'demo-chat', max_tokens: 2,
                                       messages: [{ role: 'user', content: 'hi' }], ...extra }),
      e => e.status === 400 && e.message.includes(field), JSON.stringify(extra));
  }
  await assert.rejects(client.completions.create({ model: 'demo-chat', prompt: 'x', best_of: 2 }),
                       e => e.status === 400 && e.message.includes('best_of'));
});

test('embeddings and models.retrieve', async () => {
  const e = await client.embeddings.create({ model: 'demo-embed', input: ['a', 'b'] });
  assert.equal(e.data.length, 2);
  const m = await client.models.retrieve('demo-chat');
  assert.equal(m.id, 'demo-chat');
  await assert.rejects(client.models.retrieve('nope'), e => e.status === 404);
});

test('responses.create, plain and streaming', async () => {
  const r = await client.responses.create({ model: 'demo-chat', input: 'hello', max_output_tokens: 16,
                                            instructions: 'be brief' });
  assert.equal(typeof r.output_text, 'string');
  assert.ok(r.output_text.length > 0);
  // a random-weight model runs out of tokens: OpenAI's "incomplete"
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  const s = await client.responses.create({ model: 'demo-chat', input: 'hello', max_output_tokens: 8,
                                            stream: true });
  const types = [];
  let text = '';
  for await (const e of s) {
    types.push(e.type);
    if (e.type === 'response.output_text.delta') text += e.delta;
  }
  assert.equal(types[0], 'response.created');
  assert.ok(types.includes('response.output_text.delta'));
  assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)), types.at(-1));
  assert.ok(text.length > 0);
  const j = await client.responses.create({
    model: 'demo-chat', input: 'a trip', max_output_tokens: 60,
    text: { format: { type: 'json_schema', name: 'trip', schema: trip, strict: true } } });
  assert.ok(new Ajv().compile(trip)(JSON.parse(j.output_text)), j.output_text);
  const t = await client.responses.create({
    model: 'demo-chat', input: 'weather?', max_output_tokens: 80, tool_choice: 'required',
    tools: [{ type: 'function', name: 'get_weather', parameters: weather[0].function.parameters }] });
  const call = t.output.find(o => o.type === 'function_call');
  assert.equal(call.name, 'get_weather');
  JSON.parse(call.arguments);
  await assert.rejects(client.responses.create({ model: 'demo-chat', input: 'x', store: true }),
                       e => e.status === 400 && e.message.includes('store'));
});

test('audio through the SDK: speech then transcription', async () => {
  const speech = await client.audio.speech.create({ model: 'tts', voice: 'slt', response_format: 'wav',
                                                    input: 'the quick brown fox' });
  const wav = Buffer.from(await speech.arrayBuffer());
  assert.equal(wav.subarray(0, 4).toString(), 'RIFF');
  const t = await client.audio.transcriptions.create({ model: 'asr',
                                                        file: await toFile(wav, 'a.wav') });
  assert.equal(typeof t.text, 'string');
  assert.ok(t.text.includes('quick') || t.text.includes('fox'), t.text);
});
