// Structured output end to end through the official OpenAI SDK: `kiln serve` on a random-weight
// tiny model (../shared/models/tiny-llama, context 256) at temperature 1. The SDK's
// chat.completions.parse with a zod schema (zodResponseFormat: strict json_schema), response_format
// json_object, and corpus schemas (../shared/fixtures/json_schemas) whose outputs are validated by
// ajv, an independent validator: every output that finished ("stop") of a schema kiln compiled
// without warnings must validate. Schemas ajv cannot compile, those kiln refuses, those with
// warnings (keywords not enforced) and outputs cut by the context ("length") are counted and
// printed. A random model picks nearly uniformly among the allowed tokens, so strings would
// rarely close within the context: requests carry a logit_bias towards '"', ']' and '}' (after
// the mask: it never makes a disallowed token possible). And the 400s: a bad schema, an
// unsupported keyword under strict, a bad GBNF; grammar and regex fields on /v1/completions.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import { startServer, SHARED } from './serve_util.mjs';

const MODEL = path.join(SHARED ?? '', 'models/tiny-llama');
let server, client;
before(async () => {
  server = await startServer(['--model', MODEL, '--batch', '16']);
  client = new OpenAI({ baseURL: server.base + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await server?.stop(); });

// The bias towards short outputs, from the model's vocabulary (SentencePiece pieces and byte tokens).
const BIAS = (() => {
  const vocab = JSON.parse(readFileSync(path.join(MODEL, 'tokenizer.json'), 'utf8')).model.vocab;
  const bias = {};
  for (const [piece, id] of Object.entries(vocab)) {
    if (piece.includes('"') || piece === '<0x22>') bias[id] = 8;
    else if ([']', '}', '<0x5D>', '<0x7D>'].includes(piece)) bias[id] = 4;
  }
  return bias;
})();
const msgs = [{ role: 'user', content: 'Once upon a time' }];

async function post(route, body) {
  const res = await fetch(server.base + route, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body) });
  return { status: res.status, body: await res.json() };
}

test('chat.completions.parse with a zod schema gives a parsed object', async () => {
  const Person = z.object({ name: z.string().max(12), age: z.number().int(), tags: z.array(z.enum(['a', 'b', 'c'])) });
  for (const seed of [1, 2, 3]) {
    const c = await client.chat.completions.parse({ model: 'tiny-llama', messages: msgs, temperature: 1, seed,
      logit_bias: BIAS, response_format: zodResponseFormat(Person, 'person') });
    const m = c.choices[0].message;
    assert.equal(c.choices[0].finish_reason, 'stop');
    assert.ok(m.parsed, m.content);
    assert.deepEqual(Person.parse(m.parsed), m.parsed);
    assert.deepEqual(Object.keys(m.parsed), ['name', 'age', 'tags']);  // strict: no other keys, in order
  }
});

test('response_format json_object gives a JSON object, streamed or not', async () => {
  for (const seed of [1, 2, 3, 4]) {
    const c = await client.chat.completions.create({ model: 'tiny-llama', messages: msgs, temperature: 1, seed,
      logit_bias: BIAS, response_format: { type: 'json_object' } });
    if (c.choices[0].finish_reason !== 'stop') continue;
    const v = JSON.parse(c.choices[0].message.content);
    assert.ok(v && typeof v === 'object' && !Array.isArray(v), c.choices[0].message.content);
    const stream = await client.chat.completions.create({ model: 'tiny-llama', messages: msgs, temperature: 1, seed,
      logit_bias: BIAS, response_format: { type: 'json_object' }, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    assert.equal(text, c.choices[0].message.content);  // the same seed, the same output
  }
});

test('corpus schemas: finished outputs validate under ajv', async () => {
  const dir = path.join(SHARED, 'fixtures/json_schemas');
  const files = readdirSync(dir).filter((f) => f.endsWith('.json')).sort();
  const ajv = new Ajv({ strict: false, validateSchema: false, allErrors: false, logger: false });
  addFormats(ajv);
  const n = { sent: 0, ajv_skipped: 0, kiln_refused: 0, length: 0, valid: 0, invalid: 0, warned_valid: 0, warned_invalid: 0 };
  const invalid = [];
  const jobs = [];
  for (const [i, f] of files.entries()) {
    if (i % 2) continue;  // every other schema: 200 or so
    const schema = JSON.parse(readFileSync(path.join(dir, f), 'utf8')).schema;
    let validate;
    try { validate = ajv.compile(schema); } catch { ++n.ajv_skipped; continue; }
    jobs.push({ f, schema, validate, seed: i });
  }
  const run = async ({ f, schema, validate, seed }) => {
    ++n.sent;
    const { status, body } = await post('/v1/chat/completions', { model: 'tiny-llama', messages: msgs, temperature: 1,
      seed, logit_bias: BIAS, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } });
    if (status === 400) { ++n.kiln_refused; return; }
    assert.equal(status, 200, JSON.stringify(body));
    const ch = body.choices[0];
    if (ch.finish_reason === 'length') { ++n.length; return; }
    assert.equal(ch.finish_reason, 'stop');
    let v;
    try { v = JSON.parse(ch.message.content); } catch { v = undefined; }
    const ok = v !== undefined && validate(v);
    // With warnings the grammar is looser than the schema: counted, not held to it.
    if (body.warnings?.length) { ++n[ok ? 'warned_valid' : 'warned_invalid']; return; }
    if (ok) { ++n.valid; return; }
    ++n.invalid;
    invalid.push(`${f}: ${ch.message.content} ${JSON.stringify(validate.errors)}`);
  };
  for (let at = 0; at < jobs.length; at += 16) await Promise.all(jobs.slice(at, at + 16).map(run));
  console.log('structured corpus:', JSON.stringify(n));
  assert.deepEqual(invalid, []);
  assert.ok(n.valid >= 100, JSON.stringify(n));
});

test('bad schemas, strict with an unsupported keyword, bad grammars: 400 naming the problem', async () => {
  const rf = (schema, strict) => ({ type: 'json_schema', json_schema: { name: 'x', schema, strict } });
  let r = await post('/v1/chat/completions', { messages: msgs, response_format: rf({ type: 'foo' }) });
  assert.equal(r.status, 400);
  assert.equal(r.body.error.code, 'invalid_schema');
  assert.equal(r.body.error.param, 'response_format.json_schema.schema');
  assert.match(r.body.error.message, /unknown type "foo"/);
  const notSchema = { type: 'object', properties: { a: { type: 'string', not: { const: 'x' } } } };
  r = await post('/v1/chat/completions', { messages: msgs, response_format: rf(notSchema, true) });
  assert.equal(r.status, 400);
  assert.equal(r.body.error.code, 'unsupported_schema_keyword');
  assert.match(r.body.error.message, /'not' at #\/properties\/a/);
  // The SDK sees it as a 400 too.
  await assert.rejects(client.chat.completions.create({ model: 'tiny-llama', messages: msgs,
    response_format: rf(notSchema, true) }), (e) => e.status === 400);
  // Not strict: served, with a warning naming the keyword.
  r = await post('/v1/chat/completions', { messages: msgs, max_tokens: 5, response_format: rf(notSchema, false) });
  assert.equal(r.status, 200);
  assert.ok(r.body.warnings.some((w) => /'not' at #\/properties\/a/.test(w)), JSON.stringify(r.body.warnings));
  r = await post('/v1/completions', { prompt: 'x', grammar: 'root ::= undefined-rule' });
  assert.equal(r.status, 400);
  assert.equal(r.body.error.param, 'grammar');
  r = await post('/v1/completions', { prompt: 'x', regex: '(a' });
  assert.equal(r.status, 400);
  assert.equal(r.body.error.param, 'regex');
  r = await post('/v1/completions', { prompt: 'x', regex: 'a', grammar: 'root ::= "a"' });
  assert.equal(r.status, 400);
});

test('grammar (GBNF) and regex on /v1/completions, and response_format there too', async () => {
  for (const seed of [1, 2, 3]) {
    let r = await post('/v1/completions', { prompt: 'x', temperature: 1, seed, grammar: 'root ::= "(" [0-9] [0-9]? ")"' });
    assert.equal(r.status, 200);
    assert.match(r.body.choices[0].text, /^\([0-9]{1,2}\)$/);
    assert.equal(r.body.choices[0].finish_reason, 'stop');
    r = await post('/v1/completions', { prompt: 'x', temperature: 1, seed, regex: '(cat|dog)-[a-f]{2}' });
    assert.match(r.body.choices[0].text, /^(cat|dog)-[a-f]{2}$/);
    r = await post('/v1/completions', { prompt: 'x', temperature: 1, seed, logit_bias: BIAS,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { enum: ['red', 'green', 7] } } } });
    assert.ok(['red', 'green', 7].includes(JSON.parse(r.body.choices[0].text)), r.body.choices[0].text);
  }
});
