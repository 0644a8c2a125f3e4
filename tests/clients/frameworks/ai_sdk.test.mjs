// The Vercel AI SDK (`ai` + @ai-sdk/openai-compatible with
// supportsStructuredOutputs, so the zod 4 schema is sent as response_format
// json_schema) against a real `arbiter serve` on the demo models:
// generateObject with a schema of integers (zod writes their ±(2^53 − 1)
// bounds), numbers, enums, nested objects and arrays, and generateText with
// tools and toolChoice "required". Every case runs with
// 20 seeds and maxOutputTokens ≤ 200; every answer must be what the SDK
// parses and validates with zod itself, and validate against the schema
// (Ajv). Run by CTest (framework_client_tests) through run-node-tests.sh.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateObject, generateText, tool } from 'ai';
import Ajv from 'ajv';
import { z } from 'zod';

import { SEEDS, forEachSeed } from './lib/seeds.mjs';
import { startServer } from './lib/server.mjs';

let server;
let model;
before(async () => {
  server = await startServer();
  const arbiter = createOpenAICompatible({
    name: 'arbiter', baseURL: `${server.baseURL}/v1`, apiKey: 'unused',
    supportsStructuredOutputs: true });
  model = arbiter('demo-chat');
});
after(async () => { await server?.stop(); });

function validator(schema) {
  const validate = new Ajv().compile(z.toJSONSchema(schema, { target: 'draft-7' }));
  return value => {
    assert.ok(validate(value), `${JSON.stringify(value)}: ${JSON.stringify(validate.errors)}`);
    assert.deepEqual(schema.parse(value), value);
  };
}

const Order = z.object({
  id: z.number().int(),
  total: z.number(),
  status: z.enum(['pending', 'paid', 'shipped']),
  customer: z.object({ name: z.string().max(24), vip: z.boolean() }),
  items: z.array(z.object({ sku: z.string().max(12), qty: z.number().int().min(1) })).max(3),
});
const checkOrder = validator(Order);

test('generateObject with a zod schema', async () => {
  await forEachSeed(SEEDS, async seed => {
    const { object, finishReason } = await generateObject({
      model, schema: Order, schemaName: 'order', prompt: 'An order, please.', seed,
      temperature: 1, maxOutputTokens: 200, maxRetries: 0 });
    checkOrder(object);
    assert.equal(finishReason, 'stop');
  });
});

const AddArgs = z.object({ a: z.number(), b: z.number() });
const NoteArgs = z.object({ title: z.string().max(24), priority: z.number().int().min(1).max(5),
                            labels: z.array(z.enum(['home', 'work', 'misc'])).max(2) });
const tools = {
  add: tool({ description: 'Add two numbers', inputSchema: AddArgs }),
  save_note: tool({ description: 'Save a note', inputSchema: NoteArgs }),
};
const inputOf = { add: validator(AddArgs), save_note: validator(NoteArgs) };

test('generateText with toolChoice "required"', async () => {
  await forEachSeed(SEEDS, async seed => {
    const r = await generateText({
      model, tools, toolChoice: 'required', prompt: 'add 2 and 3', seed, temperature: 1,
      maxOutputTokens: 150, maxRetries: 0 });
    assert.equal(r.finishReason, 'tool-calls', `finishReason ${r.finishReason}: ${r.text}`);
    assert.equal(r.toolCalls.length, 1, JSON.stringify(r.toolCalls));
    const [call] = r.toolCalls;
    assert.ok(!call.invalid, `invalid call: ${JSON.stringify(call)}`);
    inputOf[call.toolName](call.input);
  });
});
