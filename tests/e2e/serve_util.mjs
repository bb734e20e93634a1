// Shared by the e2e tests: start a `kiln serve` on any free port and wait for /health.
import { spawn } from 'node:child_process';

export const BIN = process.env.KILN_BIN;
export const SHARED = process.env.KILN_SHARED_DIR;

// Starts `kiln serve --port 0 ...args`, reads the port from its startup line, waits for /health.
// stderr(): what the server wrote so far; stop(signal): kills it and resolves when it exited.
export async function startServer(args = []) {
  if (!BIN) throw new Error('set KILN_BIN to the kiln binary');
  const proc = spawn(BIN, ['serve', '--port', '0', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('kiln serve did not start: ' + err)), 30000);
    proc.stderr.on('data', (d) => {
      err += d;
      const m = err.match(/http:\/\/[^:]+:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => reject(new Error(`kiln serve exited (${code}): ${err}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 100; ++i) {
    try { if ((await fetch(base + '/health')).ok) break; } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 50));
  }
  const exited = new Promise((r) => proc.once('exit', r));
  return { proc, base, stderr: () => err, stop: (signal = 'SIGTERM') => { proc.kill(signal); return exited; } };
}
