// LangChain JS (@langchain/openai's ChatOpenAI, unmodified, baseURL at a
// real `arbiter serve` on the demo models) with zod 4 schemas: structured
// output by JSON schema (withStructuredOutput's default, response_format
// json_schema) and by a forced function call (method "functionCalling"),
// over integers (zod writes their ±(2^53 − 1) bounds), numbers, enums,
// nested objects and arrays; and bindTools with tool_choice "required" and
// with a named tool, answered whole and streamed. Every case runs with 20
// seeds and max_tokens ≤ 200; every answer must be what LangChain parses
// (its own zod parsing for structured output) and validate against the
// schema (Ajv). Run by CTest (framework_client_tests) through
// run-node-tests.sh.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { ChatOpenAI } from '@langchain/openai';
import Ajv from 'ajv';
import { z } from 'zod';

import { SEEDS, forEachSeed } from './lib/seeds.mjs';
import { startServer } from './lib/server.mjs';

let server;
before(async () => { server = await startServer(); });
after(async () => { await server?.stop(); });

function chat(seed, extra = {}) {
  return new ChatOpenAI({
    model: 'demo-chat', apiKey: 'unused', maxRetries: 0, maxTokens: 150, temperature: 1,
    configuration: { baseURL: `${server.baseURL}/v1` }, modelKwargs: { seed }, ...extra });
}

// Ajv over the JSON schema zod writes for `schema` (draft-07, Ajv's default).
function validator(schema) {
  const validate = new Ajv().compile(z.toJSONSchema(schema, { target: 'draft-7' }));
  return value => {
    assert.ok(validate(value), `${JSON.stringify(value)}: ${JSON.stringify(validate.errors)}`);
    for (const n of numbersIn(value)) assert.ok(Number.isFinite(n), `non-finite ${n}`);
  };
}

function* numbersIn(v) {
  if (typeof v === 'number') yield v;
  else if (Array.isArray(v)) for (const x of v) yield* numbersIn(x);
  else if (v && typeof v === 'object') for (const x of Object.values(v)) yield* numbersIn(x);
}

const Person = z.object({
  name: z.string().max(24),
  age: z.number().int(),
  height_m: z.number(),
  role: z.enum(['admin', 'editor', 'viewer']),
  address: z.object({ city: z.string().max(24), zip: z.number().int().min(0).max(99999) }),
  tags: z.array(z.string().max(12)).max(3),
  scores: z.array(z.number().int()).max(4),
});
const checkPerson = validator(Person);

for (const method of ['jsonSchema', 'functionCalling']) {
  test(`withStructuredOutput (${method}): integers, numbers, enums, nested objects, arrays`,
       async () => {
    await forEachSeed(SEEDS, async seed => {
      const structured = chat(seed).withStructuredOutput(Person, { method, name: 'person' });
      const person = await structured.invoke('Describe a person.');  // zod-parsed by LangChain
      checkPerson(person);
      assert.deepEqual(Person.parse(person), person);
    });
  });
}

const AddArgs = z.object({ a: z.number(), b: z.number() });
const LookupArgs = z.object({
  city: z.string().max(24), days: z.number().int().min(1).max(14), units: z.enum(['metric', 'imperial']) });
const tools = [
  { name: 'add', description: 'Add two numbers', schema: AddArgs },
  { name: 'lookup_weather', description: 'Weather forecast of a city', schema: LookupArgs },
];
const argsOf = { add: validator(AddArgs), lookup_weather: validator(LookupArgs) };

// One AIMessage from a forced call: exactly one parsed call of `names`.
function checkCall(message, names) {
  assert.deepEqual(message.invalid_tool_calls ?? [], [], 'invalid_tool_calls');
  assert.equal(message.tool_calls?.length, 1, `tool_calls: ${JSON.stringify(message)}`);
  const [call] = message.tool_calls;
  assert.ok(names.includes(call.name), call.name);
  argsOf[call.name](call.args);
  return call;
}

test('bindTools with tool_choice "required" answers a parsed call', async () => {
  await forEachSeed(SEEDS, async seed => {
    const m = await chat(seed).bindTools(tools, { tool_choice: 'required' }).invoke('add 2 and 3');
    checkCall(m, ['add', 'lookup_weather']);
    assert.equal(m.response_metadata.finish_reason, 'tool_calls');
  });
});

test('bindTools with a named tool answers a call of that tool', async () => {
  await forEachSeed(SEEDS, async seed => {
    const m = await chat(seed, { maxTokens: 200 })
      .bindTools(tools, { tool_choice: 'lookup_weather' }).invoke('weather in Oslo?');
    assert.equal(checkCall(m, ['lookup_weather']).name, 'lookup_weather');
  });
});

test('bindTools streamed: the chunks add up to one parsed call', async () => {
  await forEachSeed(SEEDS, async seed => {
    const stream = await chat(seed).bindTools(tools, { tool_choice: 'add' }).stream('add 2 and 3');
    let message;
    for await (const chunk of stream) message = message === undefined ? chunk : message.concat(chunk);
    assert.equal(checkCall(message, ['add']).name, 'add');
  });
});
