// MCP server configuration: the common `mcpServers` JSON (Claude Desktop's, Cursor's, LM Studio's):
//   {"mcpServers": {"NAME": {"command": "npx", "args": [...], "env": {...}},          stdio
//                   "NAME2": {"url": "https://.../mcp", "headers": {...}}}}          Streamable HTTP
// plus kiln's optional per-server "timeout_s" (one tools/call; default 60) and "disabled": true.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "kiln/base/json.h"

namespace kiln::mcp {

struct ServerSpec {
  std::string name;
  std::string command;  // stdio: the program (found on PATH)
  std::vector<std::string> args;
  std::map<std::string, std::string> env;  // added to kiln's environment
  std::string url;                         // HTTP: the endpoint (command empty)
  std::map<std::string, std::string> headers;
  double timeout_s = 60;
};

// The enabled servers of a config (by name); throws [mcp] naming the server and key at fault.
std::vector<ServerSpec> parse_config(const Json& j, const std::string& where);
std::vector<ServerSpec> read_config(const std::string& path);

}  // namespace kiln::mcp
