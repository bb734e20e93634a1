// JSON-RPC 2.0 to one MCP server: over a child process's stdin/stdout (newline-delimited messages,
// the stdio transport; its stderr goes to kiln's log) or over HTTP (the Streamable HTTP transport:
// each message POSTed, the answer a JSON body or an SSE stream; the session id the server gives at
// initialize is sent back on every later request).
#pragma once
#include <memory>
#include <string>

#include "kiln/base/json.h"
#include "kiln/mcp/config.h"

namespace kiln::mcp {

// A failure of the transport or the server: it exited, timed out, or answered with a JSON-RPC error.
class McpError : public Error {
 public:
  McpError(const std::string& msg, bool dead) : Error("mcp", msg), dead_(dead) {}
  bool dead() const { return dead_; }  // the connection is gone: restart before the next call

 private:
  bool dead_;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // The result of a request; throws McpError (a JSON-RPC error answer included: dead() false).
  virtual Json request(const std::string& method, const Json& params, double timeout_s) = 0;
  virtual void notify(const std::string& method, const Json& params) = 0;
  virtual bool alive() const = 0;
};

// Starts the server (stdio) or prepares the endpoint (HTTP); a command that cannot be started
// throws [mcp] naming it.
std::unique_ptr<Transport> connect(const ServerSpec& s);

}  // namespace kiln::mcp
