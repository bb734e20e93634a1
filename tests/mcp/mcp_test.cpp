// MCP clients against a small MCP server written for the tests (tests/mcp/data/test_server.mjs,
// run by node): stdio and Streamable HTTP (JSON and SSE answers): initialize, paged tools/list,
// tools/call results (text, isError), environment passed to the child; the server killed mid-call
// gives an error result, the next call restarts it (reported) and succeeds; a call that outlives
// its timeout is an error, not a hang; a command that does not exist and malformed configs are
// clear errors.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln/mcp/client.h"

using namespace kiln;
using namespace kiln::mcp;

namespace {

const std::string kServer = std::string(KILN_SOURCE_DIR) + "/tests/mcp/data/test_server.mjs";

#define REQUIRE_NODE() \
  if (std::string(KILN_NODE_BIN).empty()) GTEST_SKIP() << "node not found at configure time"

ServerSpec stdio_spec() {
  ServerSpec s;
  s.name = "t";
  s.command = KILN_NODE_BIN;
  s.args = {kServer};
  s.env = {{"KILN_MCP_TEST_VAR", "forty-two"}};
  s.timeout_s = 10;
  return s;
}

void check_tools_and_calls(McpTools& hub) {
  const auto tools = hub.tools();
  ASSERT_EQ(tools.size(), 6u) << "tools/list is paged two at a time";
  EXPECT_EQ(tools[0].first, "t__add");
  EXPECT_EQ(tools[0].second.input_schema["required"][0], "a");
  const Json oa = hub.openai_tools();
  ASSERT_EQ(oa.size(), 6u);
  EXPECT_EQ(oa[1]["type"], "function");
  EXPECT_EQ(oa[1]["function"]["name"], "t__echo");
  EXPECT_EQ(oa[1]["function"]["parameters"]["properties"]["text"]["type"], "string");

  CallResult r = hub.call("t__add", R"({"a": 2, "b": 40})");
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(r.text, "42");
  r = hub.call("t__echo", R"({"text": "héllo\nworld"})");
  EXPECT_EQ(r.text, "héllo\nworld");
  r = hub.call("t__fail", "{}");
  EXPECT_TRUE(r.is_error);
  EXPECT_EQ(r.text, "it failed");
  r = hub.call("t__nope", "{}");
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find("unknown tool nope"), std::string::npos) << r.text;
  r = hub.call("t__add", "[1, 2]");
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find("not a JSON object"), std::string::npos) << r.text;
  EXPECT_TRUE(hub.call("other__add", "{}").is_error);
  EXPECT_FALSE(hub.has("other__add"));
  EXPECT_TRUE(hub.has("t__add"));
}

}  // namespace

TEST(Mcp, StdioServerToolsCallsAndEnvironment) {
  REQUIRE_NODE();
  McpTools hub({stdio_spec()});
  check_tools_and_calls(hub);
  EXPECT_EQ(hub.call("t__env", R"({"name": "KILN_MCP_TEST_VAR"})").text, "forty-two");
}

TEST(Mcp, AServerThatDiesMidCallIsAnErrorThenRestarted) {
  REQUIRE_NODE();
  McpTools hub({stdio_spec()});
  ASSERT_EQ(hub.call("t__add", R"({"a": 1, "b": 1})").text, "2");
  CallResult r = hub.call("t__crash", "{}");
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find("exited during tools/call"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("exit status 3"), std::string::npos) << r.text;
  EXPECT_FALSE(hub.status()[0]["running"].get<bool>());
  r = hub.call("t__add", R"({"a": 5, "b": 6})");
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_NE(r.text.find("restarted"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("11"), std::string::npos) << r.text;
  EXPECT_EQ(hub.status()[0]["restarts"].get<int>(), 1);
  EXPECT_TRUE(hub.status()[0]["running"].get<bool>());
}

TEST(Mcp, ACallPastItsTimeoutIsAnError) {
  REQUIRE_NODE();
  ServerSpec s = stdio_spec();
  s.timeout_s = 0.5;
  McpTools hub({s});
  const auto t0 = std::chrono::steady_clock::now();
  CallResult r = hub.call("t__sleep", R"({"ms": 5000})");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find("did not answer tools/call within"), std::string::npos) << r.text;
  EXPECT_LT(secs, 4.0);
  // The late answer is dropped; the server keeps serving.
  EXPECT_EQ(hub.call("t__add", R"({"a": 3, "b": 4})").text, "7");
}

TEST(Mcp, HttpServerJsonAndSseAnswers) {
  REQUIRE_NODE();
  for (const char* mode : {"", "--sse"}) {
    const std::string cmd = std::string(KILN_NODE_BIN) + " " + kServer + " --http 0 " + mode;
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char line[64] = {0};
    ASSERT_NE(std::fgets(line, sizeof line, p), nullptr);
    int port = 0, pid = 0;
    ASSERT_EQ(std::sscanf(line, "%d %d", &port, &pid), 2) << line;
    ServerSpec s;
    s.name = "t";
    s.url = "http://127.0.0.1:" + std::to_string(port) + "/mcp";
    s.timeout_s = 10;
    {
      McpTools hub({s});
      check_tools_and_calls(hub);
    }
    kill(pid, SIGTERM);
    pclose(p);
  }
}

TEST(Mcp, BadConfigsAndMissingCommandsAreClearErrors) {
  auto err = [](const std::string& text) {
    try {
      parse_config(Json::parse(text), "mcp.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err(R"({"servers": {}})").find("expected {\"mcpServers\""), std::string::npos);
  EXPECT_NE(err(R"({"mcpServers": {"a": {}}})").find("needs \"command\""), std::string::npos);
  EXPECT_NE(err(R"({"mcpServers": {"a": {"command": "x", "args": "y"}}})").find("\"args\" must be"), std::string::npos);
  EXPECT_NE(err(R"({"mcpServers": {"a b": {"command": "x"}}})").find("names are"), std::string::npos);
  EXPECT_NE(err(R"({"mcpServers": {"a": {"url": "ftp://x"}}})").find("http://"), std::string::npos);
  EXPECT_NE(err(R"({"mcpServers": {"a": {"command": "x", "timeout_s": 0}}})").find("timeout_s"), std::string::npos);
  const auto ok = parse_config(Json::parse(R"({"mcpServers": {"b": {"command": "x", "args": ["1"], "env": {"K": "v"}},
      "a": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer t"}}, "c": {"command": "y", "disabled": true}}})"),
                               "mcp.json");
  ASSERT_EQ(ok.size(), 2u);
  EXPECT_EQ(ok[0].name, "a");
  EXPECT_EQ(ok[0].headers.at("Authorization"), "Bearer t");
  EXPECT_EQ(ok[1].args, std::vector<std::string>{"1"});

  ServerSpec s;
  s.name = "gone";
  s.command = "kiln-no-such-mcp-server";
  McpTools hub({s});
  EXPECT_TRUE(hub.tools().empty());  // logged, left out
  CallResult r = hub.call("gone__x", "{}");
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find("cannot start `kiln-no-such-mcp-server`"), std::string::npos) << r.text;
}
