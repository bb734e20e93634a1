// Request validation without a server: good requests parse into the engine's parameters, and
// each kind of bad request becomes an ApiError with the right status and parameter name.
#include <gtest/gtest.h>

#include "kiln/base/mapped_file.h"
#include "kiln/server/api.h"

using namespace kiln::server;
using kiln::Json;

namespace {

struct ApiTest : ::testing::Test {
  static void SetUpTestSuite() {
    tok = kiln::tokenizer::Tokenizer::load_dir(std::string(KILN_SHARED_DIR) + "/models/stories260K").release();
  }
  static inline kiln::tokenizer::Tokenizer* tok = nullptr;
  ApiLimits lim() const {
    ApiLimits l;
    l.model_ids = {"stories260K", "/models/stories260K"};
    l.context_length = 512;
    l.vocab_size = 512;
    l.default_max_tokens = 100;
    return l;
  }
  // The status and param of the ApiError that parsing `body` throws (0 when it parses).
  std::pair<int, std::string> error_of(const std::string& body, bool chat = false) {
    try {
      auto j = parse_body(body);
      kiln::chat::Renderer render;  // no template: the fallback
      if (chat) parse_chat(j, *tok, lim(), render);
      else parse_completion(j, *tok, lim());
    } catch (const ApiError& e) {
      EXPECT_FALSE(std::string(e.what()).empty());
      EXPECT_EQ(e.to_json()["error"]["message"], e.what());
      return {e.status, e.param};
    }
    return {0, ""};
  }
};

}  // namespace

TEST_F(ApiTest, CompletionParsesIntoEngineParameters) {
  auto b = parse_body(R"({"model":"stories260K","prompt":"Once upon a time","max_tokens":7,"temperature":0.5,
    "top_p":0.9,"top_k":40,"min_p":0.05,"seed":3,"stop":["x","y"],"n":2,"logprobs":3,"echo":true,
    "logit_bias":{"5":-100},"stream":true,"stream_options":{"include_usage":true}})");
  CompletionRequest r = parse_completion(b, *tok, lim());
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0], tok->encode("Once upon a time", true));
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_EQ(*r.sampling.seed, 3u);
  EXPECT_EQ(r.stop.size(), 2u);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.choices(), 2);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_TRUE(r.echo && r.stream && r.include_usage);
  EXPECT_FLOAT_EQ(r.sampling.logit_bias.at(5), -100.0f);
  EXPECT_EQ(r.num_draft_tokens, -1);  // left out: the server's --num-draft-tokens
}

TEST_F(ApiTest, NumDraftTokensIsAnIntegerIn0To16) {
  auto parse = [&](const char* body, bool chat = false) {
    kiln::chat::Renderer render;
    auto j = parse_body(body);
    return chat ? parse_chat(j, *tok, lim(), render) : parse_completion(j, *tok, lim());
  };
  EXPECT_EQ(parse(R"({"prompt":"a","num_draft_tokens":0})").num_draft_tokens, 0);  // drafting off
  EXPECT_EQ(parse(R"({"prompt":"a","num_draft_tokens":16})").num_draft_tokens, 16);
  EXPECT_EQ(parse(R"({"messages":[{"role":"user","content":"a"}],"num_draft_tokens":5})", true).num_draft_tokens, 5);
  EXPECT_EQ(parse(R"({"prompt":"a","num_draft_tokens":null})").num_draft_tokens, -1);
  for (const char* v : {"17", "-1", "2.5", "\"3\"", "true"})
    EXPECT_EQ(error_of(std::string(R"({"prompt":"a","num_draft_tokens":)") + v + "}"),
              (std::pair<int, std::string>{400, "num_draft_tokens"}))
        << v;
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":"a"}],"num_draft_tokens":99})", true).second,
            "num_draft_tokens");
}

TEST_F(ApiTest, PromptForms) {
  auto parse = [&](const char* body) { return parse_completion(parse_body(body), *tok, lim()); };
  EXPECT_EQ(parse(R"({"prompt":[1,403,407]})").prompts[0], (std::vector<int32_t>{1, 403, 407}));
  EXPECT_EQ(parse(R"({"prompt":["a","b"]})").prompts.size(), 2u);
  EXPECT_EQ(parse(R"({"prompt":[[1,2],[3]]})").prompts[1], (std::vector<int32_t>{3}));
  // The default max_tokens is clipped to the room the prompt leaves in the context.
  std::string long_ids = "[";
  for (int i = 0; i < 500; ++i) long_ids += (i ? ",300" : "1");
  EXPECT_EQ(parse((R"({"prompt":)" + long_ids + "]}").c_str()).max_tokens, 12);
}

TEST_F(ApiTest, BadRequestsNameTheirParameter) {
  EXPECT_EQ(error_of("{\"prompt\": "), (std::pair<int, std::string>{400, ""}));
  EXPECT_EQ(error_of("[]").first, 400);
  EXPECT_EQ(error_of(R"({"prompt":5})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(error_of(R"({})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(error_of(R"({"prompt":"a","model":"other"})"), (std::pair<int, std::string>{404, "model"}));
  EXPECT_EQ(error_of(R"({"prompt":"a","n":0})").second, "n");
  EXPECT_EQ(error_of(R"({"prompt":"a","max_tokens":-1})").second, "max_tokens");
  EXPECT_EQ(error_of(R"({"prompt":"a","max_tokens":511})").second, "max_tokens");
  EXPECT_EQ(error_of(R"({"prompt":"a","max_tokens":1.5})").second, "max_tokens");
  EXPECT_EQ(error_of(R"({"prompt":"a","temperature":-1})").second, "temperature");
  EXPECT_EQ(error_of(R"({"prompt":"a","temperature":"1"})").second, "temperature");
  EXPECT_EQ(error_of(R"({"prompt":"a","top_p":0})").second, "top_p");
  EXPECT_EQ(error_of(R"({"prompt":"a","stop":["1","2","3","4","5"]})").second, "stop");
  EXPECT_EQ(error_of(R"({"prompt":"a","stop":[1]})").second, "stop");
  EXPECT_EQ(error_of(R"({"prompt":"a","logprobs":21})").second, "logprobs");
  EXPECT_EQ(error_of(R"({"prompt":[1,512]})").second, "prompt");
  EXPECT_EQ(error_of(R"({"prompt":[]})").second, "prompt");
  EXPECT_EQ(error_of(R"({"prompt":"a","logit_bias":{"x":1}})").second, "logit_bias");
  EXPECT_EQ(error_of(R"({"prompt":"a","logit_bias":{"1":"x"}})").second, "logit_bias");
  EXPECT_EQ(error_of(R"({"prompt":"a","logit_bias":[1]})").second, "logit_bias");
  EXPECT_EQ(error_of(R"({"prompt":"a","seed":"s"})").second, "seed");
  EXPECT_EQ(error_of(R"({"prompt":"a","echo":1})").second, "echo");
  EXPECT_EQ(error_of(R"({"prompt":"a","response_format":{"type":"xml"}})").second, "response_format.type");
  EXPECT_EQ(error_of(R"({"prompt":"a","response_format":"json"})").second, "response_format");
  EXPECT_EQ(error_of(R"({"prompt":"a","response_format":{"type":"json_schema"}})").second, "response_format.json_schema");
  EXPECT_EQ(error_of(R"({"prompt":"a","response_format":{"type":"json_schema","json_schema":{"schema":3}}})").second,
            "response_format.json_schema.schema");
  EXPECT_EQ(error_of(R"({"prompt":"a","grammar":"root ::= \"x\"","regex":"x"})").second, "regex");
  EXPECT_EQ(error_of(R"({"prompt":"a","grammar":7})").second, "grammar");
  EXPECT_EQ(error_of(R"({"prompt":"a","response_format":{"type":"text"}})").first, 0);
}

TEST_F(ApiTest, StructuredOutputFieldsBecomeAGrammarRequest) {
  auto parse = [&](const char* body) { return parse_completion(parse_body(body), *tok, lim()).grammar; };
  EXPECT_FALSE(parse(R"({"prompt":"a"})"));
  EXPECT_FALSE(parse(R"({"prompt":"a","response_format":{"type":"text"}})"));
  auto g = parse(R"({"prompt":"a","response_format":{"type":"json_object"}})");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->kind, kiln::grammar::Source::json_object);
  g = parse(R"({"prompt":"a","response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,
    "schema":{"type":"object","properties":{"a":{"type":"integer"}}}}}})");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->kind, kiln::grammar::Source::json_schema);
  EXPECT_EQ(g->text, R"({"type":"object","properties":{"a":{"type":"integer"}}})");  // key order kept
  EXPECT_TRUE(g->options.strict);
  EXPECT_FALSE(g->options.additional_properties);
  g = parse(R"({"prompt":"a","grammar":"root ::= \"x\""})");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->kind, kiln::grammar::Source::gbnf);
  EXPECT_EQ(g->text, "root ::= \"x\"");
  g = parse(R"({"prompt":"a","regex":"[0-9]+"})");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->kind, kiln::grammar::Source::regex);
}

TEST_F(ApiTest, ChatMessagesAreValidatedAndJoinedWithoutATemplate) {
  auto b = parse_body(R"({"messages":[{"role":"system","content":"Once upon"},
    {"role":"user","content":[{"type":"text","text":"a "},{"type":"text","text":"time"}]}],"logprobs":true,"top_logprobs":4})");
  kiln::chat::Renderer render;  // no template: the fallback
  CompletionRequest r = parse_chat(b, *tok, lim(), render);
  EXPECT_EQ(r.prompt_texts[0], "Once upon\na time");
  EXPECT_EQ(r.prompts[0], tok->encode("Once upon\na time", true));  // like `kiln generate --ignore-chat-template`
  EXPECT_EQ(r.logprobs, 4);
  EXPECT_EQ(error_of(R"({"messages":[]})", true).second, "messages");
  EXPECT_EQ(error_of(R"({"messages":"hi"})", true).second, "messages");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"wizard","content":"x"}]})", true).second, "messages[0].role");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user"}]})", true).second, "messages[0].content");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", true).second,
            "messages[0].content");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", true).second, "top_logprobs");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", true).second,
            "tools");
}

TEST_F(ApiTest, MessageKeyOrderReachesTheTemplate) {
  // The body is parsed order-preserving: a template iterating a message's items sees its keys in
  // the order the client sent them (not sorted), as transformers does with the request's dicts.
  kiln::chat::Renderer render(kiln::chat::ChatTemplate::from_string(
      "{% for m in messages %}{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}{% endfor %}"));
  auto b = parse_body(R"({"messages":[{"role":"user","zeta":"z","content":"hi","alpha":"a"}]})");
  CompletionRequest r = parse_chat(b, *tok, lim(), render);
  EXPECT_EQ(r.prompt_texts[0], "role=user;zeta=z;content=hi;alpha=a;");
}

TEST_F(ApiTest, ThinkingTemplatesMarkTheRequestForReasoning) {
  // Qwen3's template thinks but leaves the block to the model (or, with enable_thinking false,
  // writes an empty closed one); QwQ's opens it in the generation prompt; TinyLlama's never thinks.
  auto renderer = [](const char* name) {
    return kiln::chat::Renderer(kiln::chat::ChatTemplate::from_string(
        kiln::read_file(std::string(KILN_SHARED_DIR) + "/fixtures/chat_templates/" + name, "test"), "<s>", "</s>"));
  };
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  kiln::chat::Renderer qwen3 = renderer("Qwen-Qwen3-0.6B.jinja"), qwq = renderer("Qwen-QwQ-32B.jinja"),
                       tiny = renderer("TinyLlama-TinyLlama-1.1B-Chat-v1.0.jinja");
  CompletionRequest r = parse_chat(parse_body("{" + msgs + "}"), *tok, lim(), qwen3);
  EXPECT_TRUE(r.reasoning);
  EXPECT_FALSE(r.reasoning_open);
  r = parse_chat(parse_body("{" + msgs + R"(,"chat_template_kwargs":{"enable_thinking":false}})"), *tok, lim(), qwen3);
  EXPECT_TRUE(r.reasoning);
  EXPECT_FALSE(r.reasoning_open);
  EXPECT_TRUE(r.prompt_texts[0].ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")) << r.prompt_texts[0];
  r = parse_chat(parse_body("{" + msgs + "}"), *tok, lim(), qwq);
  EXPECT_TRUE(r.reasoning);
  EXPECT_TRUE(r.reasoning_open);
  // An earlier answer's closed block in the history does not open one.
  r = parse_chat(parse_body(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"<think>x</think>yo"},)"
                            R"({"role":"user","content":"again"}]})"),
                 *tok, lim(), qwen3);
  EXPECT_FALSE(r.reasoning_open);
  r = parse_chat(parse_body("{" + msgs + "}"), *tok, lim(), tiny);
  EXPECT_FALSE(r.reasoning);
  kiln::chat::Renderer none;
  EXPECT_FALSE(parse_chat(parse_body("{" + msgs + "}"), *tok, lim(), none).reasoning);
}
