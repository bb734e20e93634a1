// End-to-end tests of `kiln serve` through the official OpenAI SDK under node:test: a spawned
// server on the embedded stories260K (any free port, ready when /health answers), compared with
// `kiln generate` on the same prompts. Needs KILN_BIN (the kiln binary); ctest sets it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';

import { BIN, startServer } from './serve_util.mjs';

function generate(prompt, maxTokens) {
  const out = execFileSync(BIN, ['generate', '--prompt', prompt, '--max-tokens', String(maxTokens), '--temp', '0',
    '--ignore-chat-template'], { encoding: 'utf8' });
  return out.replace(/\n$/, '');  // generate ends its output with one newline
}

async function metrics(base) {
  const text = await (await fetch(base + '/metrics')).text();
  const m = {};
  for (const line of text.split('\n')) {
    const hit = line.match(/^([a-z_]+(?:\{[^}]*\})?) ([-0-9.e+]+)$/);
    if (hit) m[hit[1]] = Number(hit[2]);
  }
  return m;
}

let server, client;
before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: server.base + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await server?.stop(); });

const PROMPTS = ['Once upon a time', 'Lily and Tim', 'The cat sat', 'One day, a boy', 'The sun was',
  'Tom had a red', 'In the park', 'She was happy'];

test('greedy completion equals kiln generate', async () => {
  for (const p of PROMPTS.slice(0, 3)) {
    const r = await client.completions.create({ model: 'stories260K', prompt: p, max_tokens: 48, temperature: 0 });
    assert.equal(r.choices[0].text, generate(p, 48));
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 48);
    assert.ok(r.usage.prompt_tokens > 0);
    assert.equal(typeof r.timings.prompt_ms, 'number');
  }
});

test('greedy chat equals kiln generate --ignore-chat-template on the joined contents', async () => {
  const r = await client.chat.completions.create({ model: 'stories260K', temperature: 0, max_tokens: 40,
    messages: [{ role: 'user', content: 'Lily and Tim' }] });
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, generate('Lily and Tim', 40));
  // Two messages (one with text parts) are joined by a newline.
  const r2 = await client.chat.completions.create({ model: 'stories260K', temperature: 0, max_tokens: 30,
    messages: [{ role: 'system', content: 'Once upon a time' },
      { role: 'user', content: [{ type: 'text', text: 'there was' }, { type: 'text', text: ' a dog' }] }] });
  assert.equal(r2.choices[0].message.content, generate('Once upon a time\nthere was a dog', 30));
});

test('streamed deltas concatenate to the non-streamed text, with usage last', async () => {
  const full = await client.chat.completions.create({ model: 'stories260K', temperature: 0, max_tokens: 64,
    messages: [{ role: 'user', content: 'The cat sat' }] });
  const stream = await client.chat.completions.create({ model: 'stories260K', temperature: 0, max_tokens: 64,
    messages: [{ role: 'user', content: 'The cat sat' }], stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, role = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta.content ?? '';
      role ??= c.delta.role;
      finish = c.finish_reason ?? finish;
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(text, full.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 64);

  const cs = await client.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 50,
    temperature: 0, stream: true });
  let ctext = '';
  for await (const chunk of cs) ctext += chunk.choices[0]?.text ?? '';
  assert.equal(ctext, generate('Once upon a time', 50));
});

test('stop strings end the text before them, across token boundaries and in streams', async () => {
  const full = generate('Once upon a time', 60);
  for (const stop of ['named Lily', 'ily. Sh', 'park']) {
    const at = full.indexOf(stop);
    assert.ok(at > 0, `"${stop}" occurs in the greedy text`);
    const r = await client.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 60,
      temperature: 0, stop: [stop, 'zzzz'] });
    assert.equal(r.choices[0].text, full.slice(0, at));
    assert.equal(r.choices[0].finish_reason, 'stop');
    const s = await client.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 60,
      temperature: 0, stop, stream: true });
    let text = '', finish = null;
    for await (const chunk of s) { text += chunk.choices[0]?.text ?? ''; finish = chunk.choices[0]?.finish_reason ?? finish; }
    assert.equal(text, full.slice(0, at));
    assert.equal(finish, 'stop');
  }
});

test('logprobs: under greedy the sampled token is the first of top_logprobs', async () => {
  const r = await client.chat.completions.create({ model: 'stories260K', temperature: 0, max_tokens: 20,
    messages: [{ role: 'user', content: 'Tom had a red' }], logprobs: true, top_logprobs: 5 });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, 20);
  for (const t of content) {
    assert.equal(t.top_logprobs.length, 5);
    assert.equal(t.top_logprobs[0].token, t.token);
    assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6);
    assert.ok(t.logprob <= 0);
    for (let i = 1; i < 5; ++i) assert.ok(t.top_logprobs[i].logprob <= t.top_logprobs[i - 1].logprob);
  }
  const c = await client.completions.create({ model: 'stories260K', prompt: 'Tom had a red', max_tokens: 10,
    temperature: 0, logprobs: 3 });
  const lp = c.choices[0].logprobs;
  assert.equal(lp.tokens.length, 10);
  lp.token_logprobs.forEach((x, i) => {
    const best = Math.max(...Object.values(lp.top_logprobs[i]));
    assert.ok(Math.abs(best - x) < 1e-6, 'greedy token has the top logprob');
  });
});

test('echo + logprobs + max_tokens 0 scores the prompt like generation does', async () => {
  // Generate with logprobs, then score prompt + continuation by echo: the continuation's prompt
  // logprobs must equal the logprobs it was generated with.
  const g = await client.completions.create({ model: 'stories260K', prompt: 'One day, a boy', max_tokens: 12,
    temperature: 0, logprobs: 1, return_token_ids: true });
  const promptIds = g.choices[0].prompt_token_ids, genIds = g.choices[0].token_ids;
  assert.equal(genIds.length, 12);
  const e = await client.completions.create({ model: 'stories260K', prompt: [...promptIds, ...genIds], max_tokens: 0,
    echo: true, logprobs: 2 });
  const lp = e.choices[0].logprobs;
  assert.equal(e.usage.completion_tokens, 0);
  assert.equal(lp.tokens.length, promptIds.length + genIds.length);
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  for (let i = 0; i < genIds.length; ++i) {
    const scored = lp.token_logprobs[promptIds.length + i], generated = g.choices[0].logprobs.token_logprobs[i];
    assert.ok(Math.abs(scored - generated) < 1e-3, `token ${i}: ${scored} vs ${generated}`);
  }
  // The echoed text is the prompt's text.
  const t = await client.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 0,
    echo: true, logprobs: 0 });
  assert.equal(t.choices[0].text, 'Once upon a time');
  assert.equal(t.choices[0].logprobs.token_logprobs.length, t.usage.prompt_tokens);
});

test('the same seed at temperature 1 gives the same text', async () => {
  const req = { model: 'stories260K', prompt: 'The sun was', max_tokens: 40, temperature: 1, seed: 1234 };
  const a = await client.completions.create(req), b = await client.completions.create(req);
  assert.equal(a.choices[0].text, b.choices[0].text);
  const texts = new Set();
  for (const seed of [1, 2, 3]) texts.add((await client.completions.create({ ...req, seed })).choices[0].text);
  assert.ok(texts.size > 1, 'different seeds give different samples');
});

test('8 concurrent streams each equal their solo greedy output', async () => {
  const solo = [];
  for (const p of PROMPTS) {
    solo.push((await client.completions.create({ model: 'stories260K', prompt: p, max_tokens: 80, temperature: 0 }))
      .choices[0].text);
  }
  const results = await Promise.all(PROMPTS.map(async (p) => {
    const s = await client.completions.create({ model: 'stories260K', prompt: p, max_tokens: 80, temperature: 0,
      stream: true });
    let text = '';
    for await (const chunk of s) text += chunk.choices[0]?.text ?? '';
    return text;
  }));
  assert.deepEqual(results, solo);
});

test('a second request sharing a long prefix reuses cached KV blocks', async () => {
  const long = generate('Once upon a time', 150);  // a long, natural prefix
  const a = await client.completions.create({ model: 'stories260K', prompt: long + ' Then', max_tokens: 20, temperature: 0 });
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
  const before = await metrics(server.base);
  const b = await client.completions.create({ model: 'stories260K', prompt: long + ' After that', max_tokens: 20,
    temperature: 0 });
  const cached = b.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= 128, `cached_tokens ${cached}`);
  assert.ok(cached < b.usage.prompt_tokens);
  assert.equal(b.timings.cache_n, cached);
  assert.equal(b.timings.prompt_n, b.usage.prompt_tokens - cached);
  const after = await metrics(server.base);
  assert.equal(after.kiln_prefix_cache_hit_tokens_total - before.kiln_prefix_cache_hit_tokens_total, cached);
  // Reusing the cache does not change the result.
  assert.equal(b.choices[0].text, generate(long + ' After that', 20));
});

test('n choices, token ids, models, tokenize and detokenize', async () => {
  const r = await client.completions.create({ model: 'stories260K', prompt: 'In the park', max_tokens: 16,
    temperature: 1, seed: 5, n: 3 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  const models = await client.models.list();
  assert.equal(models.data[0].id, 'stories260K');
  const tk = await (await fetch(server.base + '/tokenize', { method: 'POST', body: JSON.stringify({ content: 'Lily and Tim' }) })).json();
  assert.ok(tk.tokens.length > 1);
  const dt = await (await fetch(server.base + '/detokenize', { method: 'POST', body: JSON.stringify({ tokens: tk.tokens }) })).json();
  assert.match(dt.content, /Lily and Tim$/);
  const at = await (await fetch(server.base + '/apply-template', { method: 'POST',
    body: JSON.stringify({ messages: [{ role: 'user', content: 'a' }, { role: 'user', content: 'b' }] }) })).json();
  assert.equal(at.prompt, 'a\nb');
});

test('bad requests get 4xx errors in OpenAI shape and the server keeps serving', async () => {
  const post = (route, body, raw = false) => fetch(server.base + route, { method: 'POST',
    headers: { 'Content-Type': 'application/json' }, body: raw ? body : JSON.stringify(body) });
  const P = '/v1/completions', C = '/v1/chat/completions';
  const ok = { model: 'stories260K', prompt: 'Hi', max_tokens: 4 };
  const msgs = [{ role: 'user', content: 'Hi' }];
  const cases = [
    ['malformed JSON', () => post(P, '{"prompt": "Hi",', true), 400],
    ['invalid UTF-8', () => post(P, Buffer.from([...Buffer.from('{"prompt": "'), 0xff, 0xfe, ...Buffer.from('"}')]), true), 400],
    ['body not an object', () => post(P, '[1, 2]', true), 400],
    ['prompt of the wrong type', () => post(P, { ...ok, prompt: 5 }), 400],
    ['temperature of the wrong type', () => post(P, { ...ok, temperature: 'hot' }), 400],
    ['missing prompt', () => post(P, { model: 'stories260K' }), 400],
    ['missing messages', () => post(C, { model: 'stories260K' }), 400],
    ['unknown model', () => post(P, { ...ok, model: 'gpt-9' }), 404],
    ['n < 1', () => post(P, { ...ok, n: 0 }), 400],
    ['negative max_tokens', () => post(P, { ...ok, max_tokens: -1 }), 400],
    ['max_tokens beyond the context', () => post(P, { ...ok, max_tokens: 100000 }), 400],
    ['temperature < 0', () => post(P, { ...ok, temperature: -0.5 }), 400],
    ['top_p 0', () => post(P, { ...ok, top_p: 0 }), 400],
    ['top_p > 1', () => post(P, { ...ok, top_p: 1.5 }), 400],
    ['5 stop strings', () => post(P, { ...ok, stop: ['a', 'b', 'c', 'd', 'e'] }), 400],
    ['completions logprobs 21', () => post(P, { ...ok, logprobs: 21 }), 400],
    ['chat top_logprobs 21', () => post(C, { model: 'stories260K', messages: msgs, logprobs: true, top_logprobs: 21 }), 400],
    ['token id outside the vocabulary', () => post(P, { ...ok, prompt: [1, 99999] }), 400],
    ['negative token id', () => post(P, { ...ok, prompt: [[1, -3]] }), 400],
    ['prompt longer than the context', () => post(P, { ...ok, prompt: new Array(600).fill(300) }), 400],
    ['logit_bias key not a token id', () => post(P, { ...ok, logit_bias: { abc: 1 } }), 400],
    ['logit_bias value not a number', () => post(P, { ...ok, logit_bias: { 5: 'x' } }), 400],
    ['logit_bias out of range', () => post(P, { ...ok, logit_bias: { 5: 500 } }), 400],
    ['message without role', () => post(C, { model: 'stories260K', messages: [{ content: 'x' }] }), 400],
    ['image content part', () => post(C, { model: 'stories260K', messages: [{ role: 'user',
      content: [{ type: 'image_url', image_url: { url: 'http://x' } }] }] }), 400],
    ['response_format json_schema with a bad schema', () => post(C, { model: 'stories260K', messages: msgs,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'foo' } } } }), 400],
    ['tools', () => post(C, { model: 'stories260K', messages: msgs, tools: [{ type: 'function', function: { name: 'f' } }] }), 400],
    ['unknown route', () => fetch(server.base + '/v1/nothing'), 404],
    ['wrong method', () => fetch(server.base + P), 405],
    ['body too large', () => post(P, { ...ok, prompt: 'x'.repeat(9 << 20) }), 413],
  ];
  for (const [what, send, status] of cases) {
    const res = await send();
    assert.equal(res.status, status, what);
    const body = await res.json();
    assert.equal(typeof body.error?.message, 'string', what);
    for (const k of ['type', 'param', 'code']) assert.ok(k in body.error, `${what}: error.${k}`);
  }
  // The SDK sees them as API errors too.
  await assert.rejects(client.completions.create({ ...ok, temperature: -1 }), (e) => e.status === 400);
  const r = await client.completions.create(ok);
  assert.equal(r.usage.completion_tokens, 4);
});

test('--chat-template renders chats; /apply-template shows the prompt the chat runs on', async () => {
  const shared = process.env.KILN_SHARED_DIR;
  assert.ok(shared, 'KILN_SHARED_DIR is set');
  const tmpl = readFileSync(path.join(shared, 'fixtures/chat_templates/TinyLlama-TinyLlama-1.1B-Chat-v1.0.jinja'), 'utf8');
  const s = await startServer(['--chat-template', tmpl]);
  try {
    const messages = [{ role: 'user', content: 'Lily and Tim' }];
    const at = await (await fetch(s.base + '/apply-template', { method: 'POST', body: JSON.stringify({ messages }) })).json();
    assert.equal(at.prompt, '<|user|>\nLily and Tim</s>\n<|assistant|>\n');
    const c = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'x', maxRetries: 0 });
    const chat = await c.chat.completions.create({ model: 'stories260K', messages, max_tokens: 30, temperature: 0 });
    // The template writes its own special tokens: the chat runs on the rendered text without BOS.
    const ids = (await (await fetch(s.base + '/tokenize', { method: 'POST',
      body: JSON.stringify({ content: at.prompt, add_special: false }) })).json()).tokens;
    assert.equal(chat.usage.prompt_tokens, ids.length);
    const comp = await c.completions.create({ model: 'stories260K', prompt: ids, max_tokens: 30, temperature: 0 });
    assert.equal(chat.choices[0].message.content, comp.choices[0].text);
    assert.ok(!('reasoning_content' in chat.choices[0].message), 'a template without <think>: no reasoning');
  } finally {
    await s.stop();
  }
});

// Thinking templates: the <think> block goes to reasoning_content. stories260K never writes the
// tags, so QwQ's template (its prompt opens the block) makes the whole answer reasoning, and
// Qwen3's with enable_thinking false (the prompt closes an empty block) leaves it all content.
test('reasoning_content: a prompt-opened <think> block, streamed and not; enable_thinking reaches the template', async () => {
  const dir = path.join(process.env.KILN_SHARED_DIR ?? '', 'fixtures/chat_templates');
  const messages = [{ role: 'user', content: 'Lily and Tim' }];
  const post = async (base, route, body) =>
    (await fetch(base + route, { method: 'POST', body: JSON.stringify(body) })).json();
  const completionOf = async (base, prompt) => {
    const ids = (await post(base, '/tokenize', { content: prompt, add_special: false })).tokens;
    return (await post(base, '/v1/completions', { prompt: ids, max_tokens: 24, temperature: 0 })).choices[0].text;
  };
  let s = await startServer(['--chat-template', readFileSync(path.join(dir, 'Qwen-QwQ-32B.jinja'), 'utf8')]);
  try {
    const at = await post(s.base, '/apply-template', { messages });
    assert.ok(at.prompt.endsWith('<|im_start|>assistant\n<think>\n'), at.prompt);
    const want = (await completionOf(s.base, at.prompt)).trim();
    assert.ok(want.length > 0 && !want.includes('</think>'));
    const c = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'x', maxRetries: 0 });
    const chat = await c.chat.completions.create({ model: 'stories260K', messages, max_tokens: 24, temperature: 0 });
    assert.equal(chat.choices[0].message.reasoning_content, want);
    assert.equal(chat.choices[0].message.content, '');
    const stream = await c.chat.completions.create({ model: 'stories260K', messages, max_tokens: 24, temperature: 0,
      stream: true });
    let reasoning = '', content = '', role = '';
    for await (const chunk of stream) {
      const d = chunk.choices[0]?.delta ?? {};
      role ||= d.role ?? '';
      reasoning += d.reasoning_content ?? '';
      content += d.content ?? '';
    }
    assert.equal(role, 'assistant');
    assert.equal(reasoning, want);
    assert.equal(content, '');
  } finally {
    await s.stop();
  }
  s = await startServer(['--chat-template', readFileSync(path.join(dir, 'Qwen-Qwen3-0.6B.jinja'), 'utf8')]);
  try {
    const kwargs = { enable_thinking: false };
    const at = await post(s.base, '/apply-template', { messages, chat_template_kwargs: kwargs });
    assert.ok(at.prompt.endsWith('<|im_start|>assistant\n<think>\n\n</think>\n\n'), at.prompt);
    const chat = await post(s.base, '/v1/chat/completions', { messages, max_tokens: 24, temperature: 0,
      chat_template_kwargs: kwargs });
    assert.equal(chat.choices[0].message.content, await completionOf(s.base, at.prompt));
    assert.ok(!('reasoning_content' in chat.choices[0].message));
  } finally {
    await s.stop();
  }
});

test("a message's key order reaches the template (bodies are parsed order-preserving)", async () => {
  const s = await startServer(['--chat-template',
    '{% for m in messages %}{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}{% endfor %}']);
  try {
    const messages = [{ role: 'user', zeta: 'z', content: 'hi', alpha: 'a' }];
    const at = await (await fetch(s.base + '/apply-template', { method: 'POST', body: JSON.stringify({ messages }) })).json();
    assert.equal(at.prompt, 'role=user;zeta=z;content=hi;alpha=a;');
  } finally {
    await s.stop();
  }
});

test('an API key guards every route but /health', async () => {
  const s = await startServer(['--api-key', 'sekrit']);
  try {
    assert.equal((await fetch(s.base + '/health')).status, 200);
    assert.equal((await fetch(s.base + '/v1/models')).status, 401);
    const bad = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e.status === 401);
    const good = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'sekrit', maxRetries: 0 });
    const r = await good.completions.create({ model: 'stories260K', prompt: 'Hi', max_tokens: 3 });
    assert.equal(r.usage.completion_tokens, 3);
  } finally {
    await s.stop();
  }
});

// Speculative decoding: a draft model (llama2xs-280K, stories260K's tokenizer) and prompt lookup.
// Greedy drafting never changes the text; usage, timings and /metrics count the drafts.
for (const [what, args] of [
  ['--draft-model', ['--draft-model', path.join(process.env.KILN_SHARED_DIR ?? '', 'models/llama2xs-280K')]],
  ['--spec-ngram', ['--spec-ngram']]]) {
  test(`speculative decoding (${what}): same greedy text, drafts counted, num_draft_tokens validated`, async () => {
    const s = await startServer(args);
    try {
      const c = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'x', maxRetries: 0 });
      const req = { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 200, temperature: 0 };
      const spec = await c.completions.create(req);
      const plain = await c.completions.create({ ...req, num_draft_tokens: 0 });
      assert.equal(spec.choices[0].text, plain.choices[0].text);
      assert.equal(spec.choices[0].text, generate('Once upon a time', 200));
      for (const u of [spec.usage, spec.timings]) {
        assert.equal(typeof u.draft_n, 'number');
        assert.ok(u.draft_n >= u.draft_n_accepted && u.draft_n_accepted >= 0, JSON.stringify(u));
      }
      assert.equal(plain.usage.draft_n, 0);  // drafting off for that request

      // Stop strings that end a burst early: the text ends where plain decoding's does, streamed too.
      for (const at of [30, 70, 120]) {
        const stop = plain.choices[0].text.slice(at, at + 4);
        const a = await c.completions.create({ ...req, stop: [stop] });
        const b = await c.completions.create({ ...req, stop: [stop], num_draft_tokens: 0 });
        assert.equal(a.choices[0].text, b.choices[0].text, JSON.stringify(stop));
        assert.equal(a.choices[0].finish_reason, 'stop');
        let streamed = '';
        for await (const chunk of await c.completions.create({ ...req, stop: [stop], stream: true }))
          streamed += chunk.choices[0]?.text ?? '';
        assert.equal(streamed, b.choices[0].text);
      }

      // Streamed chat equals non-streamed, and its usage chunk counts the drafts too.
      const chat = { model: 'stories260K', temperature: 0, max_tokens: 64, messages: [{ role: 'user', content: 'The cat sat' }] };
      const full = await c.chat.completions.create(chat);
      const stream = await c.chat.completions.create({ ...chat, stream: true, stream_options: { include_usage: true } });
      let text = '', usage = null;
      for await (const chunk of stream) {
        usage = chunk.usage ?? usage;
        for (const ch of chunk.choices) text += ch.delta.content ?? '';
      }
      assert.equal(text, full.choices[0].message.content);
      assert.ok(usage.draft_n >= usage.draft_n_accepted, JSON.stringify(usage));

      // Concurrent sequences draft and verify in one batch: each equals its solo text.
      const prompts = PROMPTS.slice(0, 4);
      const solo = await Promise.all(prompts.map(async (p) => generate(p, 60)));
      const together = await Promise.all(prompts.map(async (p) =>
        (await c.completions.create({ model: 'stories260K', prompt: p, max_tokens: 60, temperature: 0 })).choices[0].text));
      assert.deepEqual(together, solo);

      const m = await metrics(s.base);
      for (const k of ['kiln_spec_draft_tokens_total', 'kiln_spec_accepted_tokens_total', 'kiln_spec_acceptance_rate',
        'kiln_spec_mean_accepted_length']) assert.equal(typeof m[k], 'number', k);
      assert.ok(m.kiln_spec_draft_tokens_total >= m.kiln_spec_accepted_tokens_total);
      assert.ok(m.kiln_spec_acceptance_rate >= 0 && m.kiln_spec_acceptance_rate <= 1);

      const res = await fetch(s.base + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ ...req, num_draft_tokens: 99 }) });
      assert.equal(res.status, 400);
      assert.equal((await res.json()).error.param, 'num_draft_tokens');
      await assert.rejects(c.chat.completions.create({ ...chat, num_draft_tokens: -1 }), (e) => e.status === 400);
    } finally {
      await s.stop();
    }
  });
}

// stories260K finishes a whole story in milliseconds, so the abort tests run on a synthetic 100M
// model (about 20 tokens/s on a CPU): a request is surely still running when its client leaves.
// Made once, on first use; each test starts its own server so its counters start at 0.
let slowDir = null;
function slowModel() {
  if (!slowDir) {
    slowDir = mkdtempSync(path.join(tmpdir(), 'kiln-e2e-'));
    execFileSync(BIN, ['synth', '--shape', 'llama-100m', '--out', path.join(slowDir, 'm'), '--dtype', 'bf16']);
  }
  return path.join(slowDir, 'm');
}
after(() => { if (slowDir) rmSync(slowDir, { recursive: true, force: true }); });

function startSlowServer() {
  return startServer(['--model', slowModel(), '--kv-cache-bytes', String(64 << 20), '--prompt-cache-bytes', '0']);
}

// Waits until the server has generated a few tokens (the request is running), up to 5 s.
async function untilGenerating(base) {
  for (let i = 0; i < 200 && ((await metrics(base)).kiln_generation_tokens_total ?? 0) < 5; ++i)
    await new Promise((r) => setTimeout(r, 25));
}

// Polls /metrics until no sequence runs and no KV block is held, up to `ms`; returns the last metrics.
async function untilIdle(base, ms) {
  let m;
  for (const end = Date.now() + ms; ;) {
    m = await metrics(base);
    if ((m.kiln_running_sequences === 0 && m.kiln_kv_blocks_used === 0) || Date.now() > end) return m;
    await new Promise((r) => setTimeout(r, 25));
  }
}

test('a client aborting mid-stream cancels its sequence and frees its KV blocks', async () => {
  const s = await startSlowServer();
  try {
    const c = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'x', maxRetries: 0 });
    // The synthetic model's random ids mostly fall outside its (stories260K) tokenizer, so there
    // is little text: wait until the server has generated a few tokens, then abort.
    const abort = new AbortController();
    const stream = await c.completions.create({ model: 'm', prompt: 'Once upon a time', max_tokens: 400,
      temperature: 0, stream: true }, { signal: abort.signal });
    const reading = (async () => { try { for await (const _ of stream); } catch { /* aborted */ } })();
    await untilGenerating(s.base);
    abort.abort();
    await reading;
    const m = await untilIdle(s.base, 5000);
    assert.equal(m.kiln_running_sequences, 0);
    assert.equal(m.kiln_kv_blocks_used, 0);
    assert.equal(m.kiln_requests_client_disconnected_total, 1);
    assert.ok(m.kiln_generation_tokens_total < 100, `generated ${m.kiln_generation_tokens_total} of 400`);
    // And it still serves.
    const r = await c.completions.create({ model: 'm', prompt: 'Hi', max_tokens: 2 });
    assert.equal(r.usage.completion_tokens, 2);
  } finally {
    await s.stop();
  }
});

test('a client aborting a non-streaming request cancels it and frees its KV blocks', async () => {
  const s = await startSlowServer();
  try {
    const c = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'x', maxRetries: 0 });
    // 400 tokens take the server about 20 s: without the cancel the sequence would still run
    // long after the 2 s allowed below.
    for (const chat of [false, true]) {
      const before = await metrics(s.base);
      const abort = new AbortController();
      const body = chat ? { model: 'm', messages: [{ role: 'user', content: 'Once upon a time' }] }
        : { model: 'm', prompt: 'Once upon a time' };
      const pending = (chat ? c.chat.completions : c.completions).create({ ...body, max_tokens: 400, temperature: 0 },
        { signal: abort.signal });
      pending.catch(() => {});  // rejected below, once aborted
      for (let i = 0; i < 200; ++i) {
        const m = await metrics(s.base);
        if (m.kiln_generation_tokens_total - before.kiln_generation_tokens_total >= 5) break;
        await new Promise((r) => setTimeout(r, 25));
      }
      const t0 = Date.now();
      abort.abort();
      await assert.rejects(pending, (e) => e instanceof OpenAI.APIUserAbortError);
      const m = await untilIdle(s.base, 2000);
      assert.equal(m.kiln_running_sequences, 0, `chat=${chat}: running after ${Date.now() - t0} ms`);
      assert.equal(m.kiln_kv_blocks_used, 0, `chat=${chat}`);
      assert.equal(m.kiln_requests_active, 0, `chat=${chat}`);
      assert.equal(m.kiln_requests_client_disconnected_total - (before.kiln_requests_client_disconnected_total ?? 0), 1);
      assert.equal(m['kiln_requests_total{status="499"}'] - (before['kiln_requests_total{status="499"}'] ?? 0), 1);
      const generated = m.kiln_generation_tokens_total - before.kiln_generation_tokens_total;
      assert.ok(generated < 100, `chat=${chat}: generated ${generated} of 400`);
    }
    // A good request afterwards succeeds, answered as a plain JSON body.
    const res = await fetch(s.base + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'Hi', max_tokens: 2 }) });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /^application\/json/);
    assert.equal((await res.json()).usage.completion_tokens, 2);
    const r = await c.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 3 });
    assert.equal(r.usage.completion_tokens, 3);
  } finally {
    await s.stop();
  }
});
