// A small MCP server for kiln's tests (no SDK: the protocol is small): newline-delimited JSON-RPC
// on stdin/stdout, or Streamable HTTP with `--http PORT` (answers as JSON, or as an SSE stream
// with `--sse`). Tools: add {a, b}; echo {text}; env {name} (an environment variable); crash
// (exits with status 3 mid-call); sleep {ms}; fail (an isError result). Writes a line to stderr
// at start (kiln logs it). Pages tools/list two tools at a time (exercises nextCursor).
import http from 'node:http';
import readline from 'node:readline';

const tools = [
  {name: 'add', description: 'Adds two numbers', inputSchema: {type: 'object', properties: {a: {type: 'number'}, b: {type: 'number'}}, required: ['a', 'b']}},
  {name: 'echo', description: 'Echoes text', inputSchema: {type: 'object', properties: {text: {type: 'string'}}, required: ['text']}},
  {name: 'env', description: 'An environment variable', inputSchema: {type: 'object', properties: {name: {type: 'string'}}}},
  {name: 'crash', description: 'Exits mid-call', inputSchema: {type: 'object'}},
  {name: 'sleep', description: 'Waits', inputSchema: {type: 'object', properties: {ms: {type: 'number'}}}},
  {name: 'fail', description: 'Fails', inputSchema: {type: 'object'}},
];

async function handle(msg) {
  const {id, method, params} = msg;
  if (id === undefined) return null;  // a notification
  const ok = (result) => ({jsonrpc: '2.0', id, result});
  switch (method) {
    case 'initialize':
      return ok({protocolVersion: params.protocolVersion, capabilities: {tools: {}}, serverInfo: {name: 'kiln-test-mcp', version: '1'}});
    case 'tools/list': {
      const start = params && params.cursor ? Number(params.cursor) : 0;
      const page = tools.slice(start, start + 2);
      const r = {tools: page};
      if (start + 2 < tools.length) r.nextCursor = String(start + 2);
      return ok(r);
    }
    case 'tools/call': {
      const a = params.arguments || {};
      const text = (t) => ok({content: [{type: 'text', text: String(t)}]});
      if (params.name === 'add') return text(a.a + a.b);
      if (params.name === 'echo') return text(a.text);
      if (params.name === 'env') return text(process.env[a.name] ?? '');
      if (params.name === 'crash') process.exit(3);
      if (params.name === 'sleep') { await new Promise((r) => setTimeout(r, a.ms)); return text('slept'); }
      if (params.name === 'fail') return ok({content: [{type: 'text', text: 'it failed'}], isError: true});
      return {jsonrpc: '2.0', id, error: {code: -32602, message: 'unknown tool ' + params.name}};
    }
    default:
      return {jsonrpc: '2.0', id, error: {code: -32601, message: 'no method ' + method}};
  }
}

const port = process.argv.indexOf('--http');
if (port < 0) {
  process.stderr.write('kiln-test-mcp: stdio\n');
  const rl = readline.createInterface({input: process.stdin});
  rl.on('line', async (line) => {
    if (!line.trim()) return;
    const reply = await handle(JSON.parse(line));
    if (reply) process.stdout.write(JSON.stringify(reply) + '\n');
  });
  rl.on('close', () => process.exit(0));
} else {
  const sse = process.argv.includes('--sse');
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', async () => {
      const msg = JSON.parse(body);
      if (msg.method !== 'initialize' && req.headers['mcp-session-id'] !== 's-1') {
        res.writeHead(400); res.end('no session'); return;
      }
      const reply = await handle(msg);
      if (!reply) { res.writeHead(202); res.end(); return; }
      const headers = msg.method === 'initialize' ? {'Mcp-Session-Id': 's-1'} : {};
      if (sse) {
        res.writeHead(200, {...headers, 'Content-Type': 'text/event-stream'});
        res.write('event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress","params":{}}\n\n');
        res.end('event: message\ndata: ' + JSON.stringify(reply) + '\n\n');
      } else {
        res.writeHead(200, {...headers, 'Content-Type': 'application/json'});
        res.end(JSON.stringify(reply));
      }
    });
  });
  server.listen(Number(process.argv[port + 1]), '127.0.0.1', () => process.stdout.write(server.address().port + ' ' + process.pid + '\n'));
}
