// lm-evaluation-harness over HTTP: its `local-completions` model scores a loglikelihood request by
// POSTing the context + continuation token ids to /v1/completions with echo, max_tokens 1,
// logprobs 1 and temperature 0, then summing token_logprobs[ctxlen:-1] (is_greedy: each of those
// equals the largest of its top_logprobs; lm_eval/models/openai_completions.py). Those numbers must
// equal `kiln evaluate`'s own for the same requests (from --log-samples) on the embedded stories260K.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { BIN, SHARED, startServer } from './serve_util.mjs';

if (!BIN || !SHARED) throw new Error('set KILN_BIN and KILN_SHARED_DIR');

let server, dir;
before(async () => {
  server = await startServer();
  dir = mkdtempSync(path.join(tmpdir(), 'kiln-lm-eval-'));
});
after(async () => { await server?.stop(); if (dir) rmSync(dir, { recursive: true, force: true }); });

// lm-eval's LocalCompletionsAPI: the loglikelihood payload (model = the served model's name, as
// lm_eval's model_args pass it) and parse_logprobs.
async function lmEvalLoglikelihood(base, requests) {
  const res = await fetch(base + '/v1/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'stories260K', prompt: requests.map(([c, x]) => c.concat(x)), temperature: 0, max_tokens: 1,
      logprobs: 1, seed: 1234, echo: true }),
  });
  assert.equal(res.status, 200, await res.clone().text());
  const out = await res.json();
  const choices = [...out.choices].sort((a, b) => a.index - b.index);
  return choices.map((choice, i) => {
    const ctxlen = requests[i][0].length;
    const lps = choice.logprobs.token_logprobs.slice(ctxlen, -1);
    const tops = choice.logprobs.top_logprobs.slice(ctxlen, -1);
    let greedy = true;
    lps.forEach((lp, k) => { if (lp !== Math.max(...Object.values(tops[k]))) greedy = false; });
    return [lps.reduce((a, b) => a + b, 0), greedy];
  });
}

for (const task of ['arc_easy', 'hellaswag', 'lambada_openai']) {
  test(`${task}: lm-eval's local-completions loglikelihoods equal kiln evaluate's`, async () => {
    execFileSync(BIN, ['evaluate', '--tasks', task, '--limit', '5', '--log-samples', '--no-evals-db',
      '--data-dir', path.join(SHARED, 'fixtures/eval'), '--output-dir', dir], { stdio: 'ignore' });
    const lines = readFileSync(path.join(dir, `samples_stories260K_${task}.jsonl`), 'utf8').trim().split('\n');
    assert.equal(lines.length, 5);
    for (const line of lines) {
      const s = JSON.parse(line);
      const got = await lmEvalLoglikelihood(server.base, s.token_ids);
      got.forEach(([ll, greedy], k) => {
        const [[want, wantGreedy]] = s.resps[k];
        assert.ok(Math.abs(ll - want) < 1e-4, `doc ${s.doc_id} request ${k}: ${ll} vs ${want}`);
        assert.equal(greedy, wantGreedy, `doc ${s.doc_id} request ${k}: is_greedy`);
      });
    }
  });
}
