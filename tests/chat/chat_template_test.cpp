// Chat templates end to end: every fixture template under shared/fixtures/chat_templates renders
// every case of renders/cases.json byte for byte as transformers 5.17 did (or fails where it
// failed); every template of the ollama index parses and renders; model-folder discovery.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "kiln/base/error.h"
#include "kiln/chat/chat_template.h"

namespace kiln::chat {
namespace {

namespace fs = std::filesystem;
using OJson = nlohmann::ordered_json;

const fs::path kTemplates = fs::path(KILN_SHARED_DIR) / "fixtures" / "chat_templates";

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

OJson read_json(const fs::path& p) { return OJson::parse(read_file(p)); }

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// A fresh temporary model folder per test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("kiln_chat_template_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

TEST(ChatTemplate, FixtureRendersAreByteExact) {
  setenv("KILN_FAKE_DATE", "2026-11-30", 1);  // the date of the reference renders (strftime_now)
  OJson cases = read_json(kTemplates / "renders" / "cases.json");
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(kTemplates / "renders")) {
    if (entry.path().filename() == "cases.json") continue;
    OJson ref = read_json(entry.path());
    std::string name = ref["template"].get<std::string>();
    ChatTemplate ct = ChatTemplate::from_string(read_file(kTemplates / name), ref["bos_token"].get<std::string>(),
                                                ref["eos_token"].get<std::string>());
    ASSERT_EQ(ref["results"].size(), cases.size()) << name;
    for (size_t i = 0; i < cases.size(); ++i) {
      const OJson& c = cases[i];
      const OJson& r = ref["results"][i];
      ASSERT_EQ(r["case"], c["name"]);
      OJson extra = c.contains("kwargs") ? c["kwargs"] : OJson::object();
      extra["date_string"] = ref["date_string"];
      OJson tools = c.contains("tools") ? c["tools"] : OJson();
      if (r.contains("error")) {
        EXPECT_THROW(ct.render(c["messages"], tools, c["add_generation_prompt"].get<bool>(), extra), kiln::Error)
            << name << " / " << c["name"];
      } else {
        EXPECT_EQ(ct.render(c["messages"], tools, c["add_generation_prompt"].get<bool>(), extra),
                  r["output"].get<std::string>())
            << name << " / " << c["name"];
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12 * 8);  // twelve templates, eight conversations
  unsetenv("KILN_FAKE_DATE");
}

TEST(ChatTemplate, RaiseExceptionMessageReachesTheCaller) {
  ChatTemplate ct = ChatTemplate::from_string(read_file(kTemplates / "google-gemma-2-2b-it.jinja"), "<bos>", "<eos>");
  OJson messages = OJson::parse(R"([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])");
  try {
    ct.render(messages, OJson(), true);
    FAIL() << "expected an error";
  } catch (const kiln::Error& e) {
    EXPECT_EQ(std::string(e.what()), "[template] raise_exception: System role not supported");
  }
}

TEST(ChatTemplate, OllamaCorpusParsesAndRenders) {
  OJson index = read_json(kTemplates / "ollama-template-index.json");
  ASSERT_EQ(index.size(), 37u);
  OJson convs = OJson::array();
  convs.push_back(OJson::parse(R"([{"role": "user", "content": "Hello!"}])"));
  convs.push_back(OJson::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                   {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}])"));
  for (const auto& entry : index) {
    std::string name = entry["name"].get<std::string>();
    ChatTemplate ct = ChatTemplate::from_string(entry["template"].get<std::string>(), "<s>", "</s>");
    for (const auto& messages : convs) {
      try {
        std::string out = ct.render(messages, OJson(), true);
        EXPECT_NE(out.find(messages.back()["content"].get<std::string>()), std::string::npos) << name;
      } catch (const kiln::Error& e) {
        // A template may refuse a conversation (raise_exception), but never for a missing feature.
        EXPECT_EQ(std::string(e.what()).rfind("[template] raise_exception: ", 0), 0u) << name << ": " << e.what();
      }
    }
  }
}

TEST(ChatTemplate, FromModelDirReadsTokenizerConfig) {
  TempDir dir;
  OJson config = {{"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
                  {"eos_token", "</s>"},
                  {"pad_token", nullptr},
                  {"chat_template", "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}"
                                    "{{ pad_token is defined }}{{ tools }}{{ add_generation_prompt }}{{ extra_kw }}"}};
  write_file(dir.path / "tokenizer_config.json", config.dump());
  auto ct = ChatTemplate::from_model_dir(dir.path.string());
  ASSERT_TRUE(ct.has_value());
  EXPECT_EQ(ct->special_tokens()["bos_token"], "<s>");
  OJson req = OJson::parse(R"({"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"extra_kw": 7},
                               "temperature": 0.5})");
  EXPECT_EQ(ct->render_request(req), "<s>[a]</s>FalseNoneTrue7");
  req["add_generation_prompt"] = false;
  req["tools"] = OJson::array();
  EXPECT_EQ(ct->render_request(req), "<s>[a]</s>False[]False7");

  // chat_template.jinja beside it replaces the config's template (transformers clobbers it).
  write_file(dir.path / "chat_template.jinja", "J{{ messages|length }}\n");
  ct = ChatTemplate::from_model_dir(dir.path.string());
  ASSERT_TRUE(ct.has_value());
  EXPECT_EQ(ct->render_request(req), "J1");
}

TEST(ChatTemplate, NamedTemplatesPickToolUseWhenToolsAreGiven) {
  TempDir dir;
  OJson config = {{"chat_template", OJson::array({{{"name", "default"}, {"template", "D"}},
                                                  {{"name", "tool_use"}, {"template", "T{{ tools|length }}"}}})}};
  write_file(dir.path / "tokenizer_config.json", config.dump());
  auto ct = ChatTemplate::from_model_dir(dir.path.string());
  ASSERT_TRUE(ct.has_value());
  EXPECT_EQ(ct->names(), (std::vector<std::string>{"default", "tool_use"}));
  OJson messages = OJson::parse(R"([{"role": "user", "content": "a"}])");
  EXPECT_EQ(ct->render(messages, OJson(), true), "D");
  EXPECT_EQ(ct->render(messages, OJson::parse(R"([{"type": "function"}])"), true), "T1");
}

TEST(ChatTemplate, OtherTemplateFilesAndMissingTemplate) {
  TempDir dir;
  write_file(dir.path / "tokenizer_config.json", R"({"eos_token": "<e>"})");
  EXPECT_FALSE(ChatTemplate::from_model_dir(dir.path.string()).has_value());

  write_file(dir.path / "chat_template.json", R"({"chat_template": "P{{ eos_token }}"})");
  auto ct = ChatTemplate::from_model_dir(dir.path.string());
  ASSERT_TRUE(ct.has_value());
  EXPECT_EQ(ct->render(OJson::array(), OJson(), true), "P<e>");

  write_file(dir.path / "additional_chat_templates" / "rag.jinja", "R");
  ct = ChatTemplate::from_model_dir(dir.path.string());
  EXPECT_EQ(ct->names(), (std::vector<std::string>{"default", "rag"}));

  ChatTemplate over = ChatTemplate::from_model_dir_with_template(dir.path.string(), "O{{ eos_token }}");
  EXPECT_EQ(over.render(OJson::array(), OJson(), true), "O<e>");
}

TEST(ChatTemplate, ThinksWhenTheSourceWritesThinkTags) {
  for (const char* name : {"Qwen-Qwen3-0.6B.jinja", "Qwen-QwQ-32B.jinja"})
    EXPECT_TRUE(ChatTemplate::from_string(read_file(kTemplates / name)).thinks()) << name;
  for (const char* name : {"Qwen-Qwen2.5-7B-Instruct.jinja", "TinyLlama-TinyLlama-1.1B-Chat-v1.0.jinja",
                           "openai-gpt-oss-120b.jinja"})
    EXPECT_FALSE(ChatTemplate::from_string(read_file(kTemplates / name)).thinks()) << name;
  // Each way a folder gives its template: tokenizer_config.json, then chat_template.jinja over it.
  TempDir dir;
  write_file(dir.path / "tokenizer_config.json", R"({"chat_template": "{{ '<think>' }}"})");
  EXPECT_TRUE(ChatTemplate::from_model_dir(dir.path.string())->thinks());
  write_file(dir.path / "chat_template.jinja", "plain");
  EXPECT_FALSE(ChatTemplate::from_model_dir(dir.path.string())->thinks());
  EXPECT_TRUE(ChatTemplate::from_model_dir_with_template(dir.path.string(), "<think>").thinks());
}

TEST(ChatTemplate, BadTemplatesAndRequestsFailWithAMessage) {
  TempDir dir;
  write_file(dir.path / "tokenizer_config.json", R"({"chat_template": "ok\n{% if %}"})");
  try {
    ChatTemplate::from_model_dir(dir.path.string());
    FAIL() << "expected a syntax error";
  } catch (const kiln::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("tokenizer_config.json: line 2:"), std::string::npos) << msg;
  }
  ChatTemplate ct = ChatTemplate::from_string("{{ messages[0].content }}");
  EXPECT_THROW(ct.render_request(OJson::parse(R"({"model": "x"})")), kiln::Error);
  EXPECT_THROW(ct.render_request(OJson::parse(R"({"messages": [], "add_generation_prompt": "yes"})")), kiln::Error);
  EXPECT_THROW(ct.render_request(OJson::parse(R"({"messages": []})")), kiln::Error);  // messages[0] of []
}

}  // namespace
}  // namespace kiln::chat
