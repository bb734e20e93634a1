// The SSD tier of `kiln serve` end to end (--ssd-cache-dir): a restarted server (after SIGTERM,
// and after kill -9) answers a long prompt it has seen from the blocks its predecessor wrote
// (cached_tokens >= 90% of the prompt, timings.cache_n_ssd says they came from disk) with the same
// text as cold; damaged files left between runs are removed and the answer is still right; a
// kill -9 in the middle of a request leaves nothing a restart trusts; --ssd-cache-bytes bounds
// the folder. Driven by the official OpenAI SDK. Needs KILN_BIN; ctest sets it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync, statSync, truncateSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';

import { startServer as start } from './serve_util.mjs';

async function startServer(args) {
  const s = await start(args);
  return { ...s, client: new OpenAI({ baseURL: s.base + '/v1', apiKey: 'unused', maxRetries: 0 }) };
}

async function metrics(base) {
  const m = {};
  for (const line of (await (await fetch(base + '/metrics')).text()).split('\n')) {
    const hit = line.match(/^([a-z_]+) ([-0-9.e+]+)$/);
    if (hit) m[hit[1]] = Number(hit[2]);
  }
  return m;
}

function blockFiles(dir) {
  const out = [];
  for (const sub of readdirSync(dir)) for (const f of readdirSync(path.join(dir, sub))) {
    if (f.includes('.kvb')) out.push(path.join(dir, sub, f));
  }
  return out;
}

const LONG = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her '
  + 'friends. One day, she saw a big red ball under a tree. She ran to the ball and picked it up. Her friend Tom came '
  + 'and said, "Can I play with the ball too?" Lily said yes, and they played together all day. When the sun went '
  + 'down, they went home happy. The next morning, Lily woke up early. She wanted to find the ball again, but it was '
  + 'gone. She looked under the bed, behind the door and in the garden. Then she saw her dog Max with the ball in his '
  + 'mouth. Lily laughed and said, "Max, you';

async function complete(srv) {
  const r = await srv.client.completions.create({ model: 'stories260K', prompt: LONG, max_tokens: 24, temperature: 0 });
  return { text: r.choices[0].text, prompt: r.usage.prompt_tokens, cached: r.usage.prompt_tokens_details.cached_tokens,
    ssd: r.timings?.cache_n_ssd };
}

test('a restarted server answers from its predecessor\'s blocks (SIGTERM, then kill -9)', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'kiln-ssd-'));
  try {
    let srv = await startServer(['--ssd-cache-dir', dir]);
    const cold = await complete(srv);
    assert.equal(cold.cached, 0);
    assert.ok(cold.prompt >= 200, `the prompt has ${cold.prompt} tokens`);
    await srv.stop('SIGTERM');
    assert.ok(blockFiles(dir).length >= Math.floor(cold.prompt / 16));

    srv = await startServer(['--ssd-cache-dir', dir]);
    const warm = await complete(srv);
    assert.ok(warm.cached >= 0.9 * warm.prompt, `cached ${warm.cached} of ${warm.prompt}`);
    assert.equal(warm.ssd, warm.cached);  // all of them read back from disk
    assert.equal(warm.text, cold.text);
    const m = await metrics(srv.base);
    assert.ok(m.kiln_ssd_cache_hits_total >= Math.floor(0.9 * warm.prompt / 16));
    assert.equal(m.kiln_ssd_cache_rejected_total, 0);
    await srv.stop('SIGKILL');

    srv = await startServer(['--ssd-cache-dir', dir]);
    const again = await complete(srv);
    assert.ok(again.cached >= 0.9 * again.prompt);
    assert.equal(again.text, cold.text);
    await srv.stop('SIGKILL');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('damaged block files are removed and counted, and the answer stays right', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'kiln-ssd-'));
  try {
    let srv = await startServer(['--ssd-cache-dir', dir]);
    const cold = await complete(srv);
    await srv.stop();
    const files = blockFiles(dir).sort();
    assert.ok(files.length >= 8);
    truncateSync(files[0], 100);                       // cut short
    const b = readFileSync(files[1]);
    b[b.length >> 1] ^= 0x20;                          // a flipped K/V byte
    writeFileSync(files[1], b);
    writeFileSync(files[2], Buffer.alloc(statSync(files[2]).size));  // zeros of the right size
    srv = await startServer(['--ssd-cache-dir', dir]);
    const warm = await complete(srv);
    assert.equal(warm.text, cold.text);
    const m = await metrics(srv.base);
    assert.ok(m.kiln_ssd_cache_rejected_total >= 2, `rejected ${m.kiln_ssd_cache_rejected_total}`);
    await srv.stop();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('kill -9 during a request leaves no block file a restart trusts', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'kiln-ssd-'));
  try {
    let srv = await startServer(['--ssd-cache-dir', dir]);
    const pending = srv.client.completions.create({ model: 'stories260K', prompt: LONG, max_tokens: 200, temperature: 0 })
      .catch(() => null);
    await new Promise((r) => setTimeout(r, 30));
    await srv.stop('SIGKILL');
    await pending;
    srv = await startServer(['--ssd-cache-dir', dir]);
    const m = await metrics(srv.base);
    assert.equal(m.kiln_ssd_cache_rejected_total, 0);  // nothing half-written was left under a block name
    for (const f of blockFiles(dir)) assert.ok(!f.includes('.tmp'), `a temporary file survived: ${f}`);
    const warm = await complete(srv);
    await srv.stop();
    srv = await startServer([]);  // no tier: the cold answer
    assert.equal(warm.text, (await complete(srv)).text);
    await srv.stop();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('--ssd-cache-bytes keeps the folder under its budget', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'kiln-ssd-'));
  try {
    const srv = await startServer(['--ssd-cache-dir', dir, '--ssd-cache-bytes', '200000']);
    await complete(srv);
    await srv.client.completions.create({ model: 'stories260K', prompt: 'The dog and the cat ' + LONG, max_tokens: 8 });
    const m = await metrics(srv.base);
    await srv.stop();
    const bytes = blockFiles(dir).reduce((s, f) => s + statSync(f).size, 0);
    assert.ok(bytes <= 200000, `${bytes} bytes on disk`);
    assert.ok(m.kiln_ssd_cache_evictions_total > 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
