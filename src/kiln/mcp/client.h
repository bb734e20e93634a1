// MCP clients: one per configured server (started on first use: initialize, then tools/list),
// and McpTools, all servers' tools offered to a model as OpenAI function tools named SERVER__TOOL
// and run through tools/call. A server that exits or stops answering never takes kiln down: the
// call in flight gets an error result, and the next call starts it again (reported in that
// call's result and counted in restarts()).
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/base/json.h"
#include "kiln/mcp/config.h"
#include "kiln/mcp/transport.h"

namespace kiln::mcp {

struct Tool {
  std::string name, description;
  Json input_schema;  // JSON Schema of the arguments
};

struct CallResult {
  bool is_error = false;
  std::string text;  // the text parts of the result joined (what goes back to the model)
  Json content;      // the result as the server gave it ("content", "structuredContent"), or null
};

class McpClient {
 public:
  explicit McpClient(ServerSpec s) : spec_(std::move(s)) {}
  const ServerSpec& spec() const { return spec_; }
  // Starts the server when needed; throws McpError when it cannot start or list its tools.
  std::vector<Tool> tools();
  // Never throws for the server's failures: they are error results naming what happened.
  CallResult call(const std::string& tool, const Json& arguments);
  int restarts() const;
  bool running() const;

 private:
  void start_locked();  // (mu_ held)
  ServerSpec spec_;
  mutable std::mutex mu_;
  std::unique_ptr<Transport> t_;
  std::vector<Tool> tools_;
  int starts_ = 0;
};

class McpTools {
 public:
  explicit McpTools(std::vector<ServerSpec> servers);
  // Starts every server and lists its tools; a server that fails is logged and left out (for now:
  // the next tools() tries it again).
  std::vector<std::pair<std::string, Tool>> tools();  // (SERVER__TOOL, tool)
  // [{"type": "function", "function": {"name", "description", "parameters"}}] for a request's tools.
  Json openai_tools();
  bool has(const std::string& full_name) const;
  // full_name is SERVER__TOOL; arguments a JSON object, or its text (as OpenAI tool calls carry it).
  CallResult call(const std::string& full_name, const std::string& arguments_json);
  // [{"name", "running", "restarts"}] for /metrics and the admin page.
  Json status();

 private:
  McpClient* client_for(const std::string& full_name, std::string& tool) const;
  std::vector<std::unique_ptr<McpClient>> clients_;
};

}  // namespace kiln::mcp
