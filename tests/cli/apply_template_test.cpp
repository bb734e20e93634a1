// `kiln apply-template` end to end through the binary: for every fixture template and every case
// of renders/cases.json, a temporary model folder holding tokenizer_config.json and a request
// file; stdout must equal the transformers reference byte for byte (or kiln must fail where it did).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli_util.h"
#include "kiln/base/json.h"

using kiln::test::run_kiln;
namespace fs = std::filesystem;
using OJson = nlohmann::ordered_json;

namespace {

const fs::path kTemplates = fs::path(KILN_SHARED_DIR) / "fixtures" / "chat_templates";

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

}  // namespace

TEST(ApplyTemplate, FixtureTemplatesMatchTransformersByteForByte) {
  setenv("KILN_FAKE_DATE", "2026-11-30", 1);  // inherited by the kiln processes (strftime_now)
  OJson cases = OJson::parse(read_file(kTemplates / "renders" / "cases.json"));
  int runs = 0;
  for (const auto& entry : fs::directory_iterator(kTemplates / "renders")) {
    if (entry.path().filename() == "cases.json") continue;
    OJson ref = OJson::parse(read_file(entry.path()));
    std::string name = ref["template"].get<std::string>();
    fs::path dir = kiln::test::make_temp_dir("kiln-apply-template-");
    OJson config = {{"bos_token", ref["bos_token"]}, {"eos_token", ref["eos_token"]},
                    {"chat_template", read_file(kTemplates / name)}};
    write_file(dir / "tokenizer_config.json", config.dump());
    for (size_t i = 0; i < cases.size(); ++i) {
      const OJson& c = cases[i];
      const OJson& r = ref["results"][i];
      OJson request = {{"messages", c["messages"]}, {"add_generation_prompt", c["add_generation_prompt"]}};
      if (c.contains("tools")) request["tools"] = c["tools"];
      request["chat_template_kwargs"] = c.contains("kwargs") ? c["kwargs"] : OJson::object();
      request["chat_template_kwargs"]["date_string"] = ref["date_string"];
      fs::path req = dir / ("request_" + std::to_string(i) + ".json");
      write_file(req, request.dump());
      auto res = run_kiln({"apply-template", "--model", dir.string(), "--request", req.string()});
      if (r.contains("error")) {
        EXPECT_NE(res.exit_code, 0) << name << " / " << c["name"] << " should fail like transformers: " << r["error"];
        EXPECT_TRUE(res.out.empty()) << name << " / " << c["name"];
        EXPECT_NE(res.err.find("[template]"), std::string::npos) << res.err;
      } else {
        EXPECT_EQ(res.exit_code, 0) << name << " / " << c["name"] << ": " << res.err;
        EXPECT_EQ(res.out, r["output"].get<std::string>()) << name << " / " << c["name"];
      }
      ++runs;
    }
    fs::remove_all(dir);
  }
  EXPECT_EQ(runs, 12 * 8);
  unsetenv("KILN_FAKE_DATE");
}

TEST(ApplyTemplate, ChatTemplateFlagAndDefaults) {
  fs::path dir = kiln::test::make_temp_dir("kiln-apply-template-");
  write_file(dir / "config.json", "{}");
  write_file(dir / "tokenizer_config.json", R"({"eos_token": "</s>", "chat_template": "M{{ eos_token }}"})");
  write_file(dir / "request.json", R"({"model": "m", "messages": [{"role": "user", "content": "hi"}]})");
  write_file(dir / "other.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}{{ add_generation_prompt }}{{ eos_token }}\n");

  auto a = run_kiln({"apply-template", "--model", dir.string(), "--request", (dir / "request.json").string()});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, "M</s>");
  // --chat-template replaces the template but keeps the folder's special tokens; the request's
  // add_generation_prompt defaults to true; the template's final newline is dropped as in jinja2.
  auto b = run_kiln({"apply-template", "--model", dir.string(), "--request", (dir / "request.json").string(),
                     "--chat-template", (dir / "other.jinja").string()});
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(b.out, "hiTrue</s>");
  auto c = run_kiln({"apply-template", "--request", "-", "--chat-template", (dir / "other.jinja").string()}, "",
                    R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false})");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(c.out, "xFalse");
  fs::remove_all(dir);
}

TEST(ApplyTemplate, ErrorsAreOneLineAndPrintNothing) {
  fs::path dir = kiln::test::make_temp_dir("kiln-apply-template-");
  write_file(dir / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  write_file(dir / "request.json", R"({"messages": []})");
  auto none = run_kiln({"apply-template", "--model", dir.string(), "--request", (dir / "request.json").string()});
  EXPECT_NE(none.exit_code, 0);
  EXPECT_TRUE(none.out.empty());
  EXPECT_NE(none.err.find("has no chat template"), std::string::npos) << none.err;

  write_file(dir / "bad.jinja", "{{ messages|frobnicate }}");
  auto bad = run_kiln({"apply-template", "--model", dir.string(), "--request", (dir / "request.json").string(),
                       "--chat-template", (dir / "bad.jinja").string()});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("line 1: unsupported filter 'frobnicate'"), std::string::npos) << bad.err;

  write_file(dir / "broken.json", "{not json");
  auto broken = run_kiln({"apply-template", "--model", dir.string(), "--request", (dir / "broken.json").string(),
                          "--chat-template", (dir / "bad.jinja").string()});
  EXPECT_NE(broken.exit_code, 0);
  EXPECT_NE(broken.err.find("invalid JSON"), std::string::npos) << broken.err;
  fs::remove_all(dir);
}

TEST(ApplyTemplate, MessageKeyOrderReachesTheTemplate) {
  fs::path dir = kiln::test::make_temp_dir("kiln-apply-template-");
  write_file(dir / "items.jinja", "{% for m in messages %}{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}{% endfor %}");
  auto r = run_kiln({"apply-template", "--request", "-", "--chat-template", (dir / "items.jinja").string()}, "",
                    R"({"messages": [{"role": "user", "zeta": "z", "content": "hi", "alpha": "a"}]})");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "role=user;zeta=z;content=hi;alpha=a;");
  fs::remove_all(dir);
}
