// McpClient and McpTools (client.h).
#include "kiln/mcp/client.h"

#include "kiln/base/log.h"
#include "kiln/base/version.h"

namespace kiln::mcp {

namespace {

constexpr double kStartTimeout = 30;  // initialize and tools/list
constexpr const char* kSep = "__";

}  // namespace

void McpClient::start_locked() {
  t_.reset();
  tools_.clear();
  ++starts_;
  auto t = connect(spec_);
  const Json init = t->request("initialize",
                               {{"protocolVersion", "2025-06-18"},
                                {"capabilities", Json::object()},
                                {"clientInfo", {{"name", "kiln"}, {"version", kVersion}}}},
                               kStartTimeout);
  t->notify("notifications/initialized", nullptr);
  std::vector<Tool> tools;
  Json cursor;
  do {
    Json params = Json::object();
    if (!cursor.is_null()) params["cursor"] = cursor;
    const Json r = t->request("tools/list", params, kStartTimeout);
    if (!r.contains("tools") || !r["tools"].is_array())
      throw McpError(fmt::format("server '{}': tools/list without a tools array", spec_.name), false);
    for (const Json& x : r["tools"]) {
      if (!x.is_object() || !x.contains("name") || !x["name"].is_string()) continue;
      Tool tl;
      tl.name = x["name"].get<std::string>();
      tl.description = x.value("description", std::string());
      tl.input_schema = x.contains("inputSchema") ? x["inputSchema"] : Json{{"type", "object"}};
      tools.push_back(std::move(tl));
    }
    cursor = r.contains("nextCursor") && r["nextCursor"].is_string() ? r["nextCursor"] : Json();
  } while (!cursor.is_null());
  log::info("mcp {}: {} ({}), {} tools", spec_.name, init.value("serverInfo", Json::object()).value("name", "?"),
            init.value("protocolVersion", std::string("?")), tools.size());
  t_ = std::move(t);
  tools_ = std::move(tools);
}

std::vector<Tool> McpClient::tools() {
  std::lock_guard lk(mu_);
  if (!t_ || !t_->alive()) start_locked();
  return tools_;
}

CallResult McpClient::call(const std::string& tool, const Json& arguments) {
  std::lock_guard lk(mu_);
  CallResult out;
  std::string note;
  try {
    if (!t_ || !t_->alive()) {
      const bool restart = starts_ > 0;
      start_locked();
      if (restart) note = fmt::format("(MCP server '{}' had stopped and was restarted) ", spec_.name);
    }
    const Json r = t_->request("tools/call", {{"name", tool}, {"arguments", arguments}}, spec_.timeout_s);
    out.is_error = r.value("isError", false);
    out.content = r;
    if (r.contains("content") && r["content"].is_array())
      for (const Json& c : r["content"]) {
        if (c.value("type", std::string()) == "text" && c.contains("text") && c["text"].is_string())
          out.text += (out.text.empty() ? "" : "\n") + c["text"].get<std::string>();
        else
          out.text += (out.text.empty() ? "" : "\n") + c.dump();
      }
    if (out.text.empty() && r.contains("structuredContent")) out.text = r["structuredContent"].dump();
    out.text = note + out.text;
  } catch (const McpError& e) {
    if (e.dead()) t_.reset();  // started again on the next call
    out.is_error = true;
    out.text = note + e.what();
    log::warn("{}", e.what());
  } catch (const Error& e) {  // could not start it at all (command missing)
    out.is_error = true;
    out.text = e.what();
    log::warn("{}", e.what());
  }
  return out;
}

int McpClient::restarts() const {
  std::lock_guard lk(mu_);
  return std::max(0, starts_ - 1);
}

bool McpClient::running() const {
  std::lock_guard lk(mu_);
  return t_ && t_->alive();
}

McpTools::McpTools(std::vector<ServerSpec> servers) {
  for (ServerSpec& s : servers) clients_.push_back(std::make_unique<McpClient>(std::move(s)));
}

std::vector<std::pair<std::string, Tool>> McpTools::tools() {
  std::vector<std::pair<std::string, Tool>> out;
  for (auto& c : clients_) {
    try {
      for (Tool& t : c->tools()) out.emplace_back(c->spec().name + kSep + t.name, std::move(t));
    } catch (const Error& e) {
      log::warn("mcp {}: its tools are not offered: {}", c->spec().name, e.what());
    }
  }
  return out;
}

Json McpTools::openai_tools() {
  Json a = Json::array();
  for (auto& [name, t] : tools())
    a.push_back({{"type", "function"},
                 {"function", {{"name", name}, {"description", t.description}, {"parameters", t.input_schema}}}});
  return a;
}

McpClient* McpTools::client_for(const std::string& full_name, std::string& tool) const {
  const size_t p = full_name.find(kSep);
  if (p == std::string::npos) return nullptr;
  for (auto& c : clients_)
    if (c->spec().name == full_name.substr(0, p)) {
      tool = full_name.substr(p + 2);
      return c.get();
    }
  return nullptr;
}

bool McpTools::has(const std::string& full_name) const {
  std::string tool;
  return client_for(full_name, tool) != nullptr;
}

CallResult McpTools::call(const std::string& full_name, const std::string& arguments_json) {
  std::string tool;
  McpClient* c = client_for(full_name, tool);
  if (!c) return {true, "no MCP tool named " + full_name, nullptr};
  Json args = arguments_json.empty() ? Json::object() : Json::parse(arguments_json, nullptr, false);
  if (args.is_discarded() || !args.is_object())
    return {true, "the arguments of " + full_name + " are not a JSON object: " + arguments_json.substr(0, 200), nullptr};
  return c->call(tool, args);
}

Json McpTools::status() {
  Json a = Json::array();
  for (auto& c : clients_)
    a.push_back({{"name", c->spec().name}, {"running", c->running()}, {"restarts", c->restarts()}});
  return a;
}

}  // namespace kiln::mcp
