// Load generator for `kiln serve`: N concurrent streaming clients on loopback, a fixed number of
// requests per level, then it stops. Reports aggregate generated tok/s at each concurrency and its
// ratio to one stream, TTFT p50/p99, and TTFT for a long shared prefix, cold vs prefix-cache hit.
//   node bench/serve_load.mjs --bin build/kiln [--model DIR] [--levels 1,4,16] [--requests 32]
//        [--max-tokens 64] [--prefix-tokens 400] [--url http://127.0.0.1:8080 (use a running server)]
// Needs only Node >= 18 (fetch); it starts and stops its own server unless --url is given.
import { spawn } from 'node:child_process';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]?.startsWith('--') || all[i + 1] === undefined ? 'true' : all[i + 1]]);
  return acc;
}, []));
const levels = (args.levels ?? '1,4,16').split(',').map(Number);
const nRequests = Number(args.requests ?? 32);
const maxTokens = Number(args['max-tokens'] ?? 64);
const prefixTokens = Number(args['prefix-tokens'] ?? 400);
const WORDS = 'the cat dog sun park ball girl boy tree red big happy sad day run jump play saw went said'.split(' ');

function percentile(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

async function startServer() {
  const extra = args.model ? ['--model', args.model] : [];
  const batch = String(Math.max(...levels));
  const proc = spawn(args.bin, ['serve', '--port', '0', '--batch', batch, ...extra], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  const port = await new Promise((resolve, reject) => {
    proc.stderr.on('data', (d) => {
      err += d;
      const m = err.match(/http:\/\/[^:]+:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    proc.on('exit', (c) => reject(new Error(`kiln serve exited ${c}: ${err}`)));
  });
  return { base: `http://127.0.0.1:${port}`, stop: () => proc.kill('SIGTERM') };
}

// One streaming completion; returns { ttft_ms, tokens, total_ms }.
async function streamOne(base, prompt, max_tokens) {
  const t0 = performance.now();
  const res = await fetch(base + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens, temperature: 0, stream: true, stream_options: { include_usage: true } }),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let ttft = null, tokens = 0, buf = '';
  const decoder = new TextDecoder();
  for await (const part of res.body) {
    buf += decoder.decode(part, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, nl);
      buf = buf.slice(nl + 2);
      if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
      const j = JSON.parse(event.slice(6));
      if (ttft === null && j.choices?.length) ttft = performance.now() - t0;
      if (j.usage) tokens = j.usage.completion_tokens;
    }
  }
  return { ttft_ms: ttft ?? performance.now() - t0, tokens, total_ms: performance.now() - t0 };
}

function randomPrompt(i, words) {
  let s = `Story ${i}:`;
  for (let k = 0; k < words; ++k) s += ' ' + WORDS[(i * 7 + k * 13 + ((i * k) % 5)) % WORDS.length];
  return s;
}

async function level(base, concurrency) {
  let next = 0;
  const results = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < nRequests) {
      const i = next++;
      results.push(await streamOne(base, randomPrompt(i, 12), maxTokens));
    }
  }));
  const wall = (performance.now() - t0) / 1000;
  const tokens = results.reduce((a, r) => a + r.tokens, 0);
  return { concurrency, requests: results.length, tokens, wall_s: wall, tok_s: tokens / wall,
    ttft_p50: percentile(results.map((r) => r.ttft_ms), 50), ttft_p99: percentile(results.map((r) => r.ttft_ms), 99) };
}

async function prefixCache(base) {
  // A long prefix shared by the hit requests; cold ones differ from their first word on.
  const long = (seed) => randomPrompt(seed, prefixTokens);
  const cold = [], hit = [];
  const shared = long(1000);
  await streamOne(base, shared + ' end', 1);  // warms the cache with the shared prefix
  for (let i = 0; i < 8; ++i) {
    cold.push((await streamOne(base, long(2000 + i), 1)).ttft_ms);
    hit.push((await streamOne(base, shared + ` question ${i}`, 1)).ttft_ms);
  }
  return { prefix_words: prefixTokens, cold_p50: percentile(cold, 50), hit_p50: percentile(hit, 50) };
}

const server = args.url ? { base: args.url, stop: () => {} } : await startServer();
try {
  await streamOne(server.base, 'warm up', 4);
  const rows = [];
  for (const c of levels) rows.push(await level(server.base, c));
  const single = rows.find((r) => r.concurrency === 1)?.tok_s ?? rows[0].tok_s;
  console.log(`model: ${args.model ?? 'embedded stories260K'}; ${nRequests} requests per level, max_tokens ${maxTokens}`);
  console.log('| concurrent | requests | tokens | wall s | tok/s | x single | TTFT p50 ms | TTFT p99 ms |');
  console.log('|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of rows)
    console.log(`| ${r.concurrency} | ${r.requests} | ${r.tokens} | ${r.wall_s.toFixed(2)} | ${r.tok_s.toFixed(1)} | ` +
      `${(r.tok_s / single).toFixed(2)} | ${r.ttft_p50.toFixed(1)} | ${r.ttft_p99.toFixed(1)} |`);
  const pc = await prefixCache(server.base);
  console.log(`\nprefix cache (${pc.prefix_words}-word shared prefix, TTFT p50 of 8): cold ${pc.cold_p50.toFixed(1)} ms, ` +
    `hit ${pc.hit_p50.toFixed(1)} ms (${(pc.cold_p50 / pc.hit_p50).toFixed(1)}x)`);
} finally {
  server.stop();
}
