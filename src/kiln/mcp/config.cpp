// parse_config (config.h).
#include "kiln/mcp/config.h"

#include <regex>

namespace kiln::mcp {

namespace {

std::map<std::string, std::string> string_map(const Json& j, const std::string& where, const char* key) {
  std::map<std::string, std::string> m;
  if (!j.contains(key)) return m;
  if (!j[key].is_object()) fail("mcp", "{}: \"{}\" must be an object of strings", where, key);
  for (auto& [k, v] : j[key].items()) {
    if (!v.is_string()) fail("mcp", "{}: {}.{} must be a string", where, key, k);
    m[k] = v.get<std::string>();
  }
  return m;
}

}  // namespace

std::vector<ServerSpec> parse_config(const Json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("mcpServers") || !j["mcpServers"].is_object())
    fail("mcp", "{}: expected {{\"mcpServers\": {{\"name\": {{\"command\": ..., \"args\": [...]}}}}}}", where);
  std::vector<ServerSpec> out;
  // Tool names are offered to models as NAME__TOOL: OpenAI's function names allow [a-zA-Z0-9_-].
  static const std::regex kName("[A-Za-z0-9_-]{1,32}");
  for (auto& [name, s] : j["mcpServers"].items()) {
    const std::string at = where + ": server \"" + name + "\"";
    if (!std::regex_match(name, kName)) fail("mcp", "{}: names are 1-32 of [A-Za-z0-9_-]", at);
    if (!s.is_object()) fail("mcp", "{} must be an object", at);
    if (s.value("disabled", false)) continue;
    ServerSpec sp;
    sp.name = name;
    if (s.contains("command")) {
      if (!s["command"].is_string() || s["command"].get<std::string>().empty())
        fail("mcp", "{}: \"command\" must be a non-empty string", at);
      sp.command = s["command"].get<std::string>();
      if (s.contains("args")) {
        if (!s["args"].is_array()) fail("mcp", "{}: \"args\" must be an array of strings", at);
        for (const Json& a : s["args"]) {
          if (!a.is_string()) fail("mcp", "{}: \"args\" must be an array of strings", at);
          sp.args.push_back(a.get<std::string>());
        }
      }
      sp.env = string_map(s, at, "env");
    } else if (s.contains("url")) {
      if (!s["url"].is_string()) fail("mcp", "{}: \"url\" must be a string", at);
      sp.url = s["url"].get<std::string>();
      if (sp.url.rfind("http://", 0) != 0 && sp.url.rfind("https://", 0) != 0)
        fail("mcp", "{}: \"url\" must start with http:// or https://", at);
      sp.headers = string_map(s, at, "headers");
    } else {
      fail("mcp", "{}: needs \"command\" (a stdio server) or \"url\" (an HTTP server)", at);
    }
    if (s.contains("timeout_s")) {
      if (!s["timeout_s"].is_number() || s["timeout_s"].get<double>() <= 0)
        fail("mcp", "{}: \"timeout_s\" must be a positive number", at);
      sp.timeout_s = s["timeout_s"].get<double>();
    }
    out.push_back(std::move(sp));
  }
  return out;
}

std::vector<ServerSpec> read_config(const std::string& path) { return parse_config(read_json_file(path, "mcp"), path); }

}  // namespace kiln::mcp
