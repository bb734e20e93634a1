// The OpenAI request schema as the server reads it: ApiError (a 4xx/5xx in OpenAI's error shape)
// and the parsed, validated form of a /v1/completions or /v1/chat/completions body.
// Parsing needs no model: only the tokenizer, the context length and the server's defaults.
// Bodies are parsed order-preserving, so chat messages reach the template with their key order.
#pragma once
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/base/json.h"
#include "kiln/chat/prompt.h"
#include "kiln/engine/sampler.h"
#include "kiln/grammar/grammar_cache.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::server {

// Thrown anywhere in request handling; the server answers {"error": {message, type, param, code}}.
struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;
  ApiError(int status_, std::string message, std::string param_ = "", std::string code_ = "",
           std::string type_ = "");
  Json to_json() const;
};

// The server's defaults and limits that requests are checked against.
struct ApiLimits {
  std::vector<std::string> model_ids;  // names a request may give as "model" (first: the one reported)
  int context_length = 0;
  int vocab_size = 0;
  int default_max_tokens = 512;
  engine::SamplingParams default_sampling;
  int max_n = 16;            // choices per request (n x prompts)
  int max_logprobs = 20;
};

// Structured output: the grammar a request's output must follow, from `response_format`
// (json_object, json_schema), `grammar` (GBNF) or `regex`; compiled by the server's GrammarCache.
struct GrammarRequest {
  grammar::Source kind = grammar::Source::json_object;
  std::string text;  // the schema (as JSON text), the GBNF or the regex; empty for json_object
  grammar::SchemaOptions options;
  std::string param;  // the field it came from (errors name it)
};

// One parsed completion or chat request.
struct CompletionRequest {
  bool chat = false;
  std::string model;
  std::vector<std::vector<int32_t>> prompts;  // token ids, one entry per prompt (chat: one)
  std::vector<std::string> prompt_texts;      // text of each prompt (for echo)
  engine::SamplingParams sampling;
  int max_tokens = 0;
  std::vector<std::string> stop;
  int n = 1;
  int logprobs = -1;          // top alternatives per token; -1: no logprobs
  bool echo = false;
  bool stream = false, include_usage = false;
  bool return_token_ids = false;
  // Speculative decoding: at most this many drafts per step (0: off); -1: the server's
  // --num-draft-tokens, which also caps a larger value.
  int num_draft_tokens = -1;
  std::optional<GrammarRequest> grammar;
  // Chat with a template that thinks (ChatTemplate::thinks): the output's <think> block goes to
  // reasoning_content; reasoning_open: the prompt opened it (the output starts inside it).
  bool reasoning = false, reasoning_open = false;
  int choices() const { return static_cast<int>(prompts.size()) * n; }
};

// Parses the JSON text of a request body; malformed JSON or a non-object -> ApiError 400.
OrderedJson parse_body(const std::string& body);
CompletionRequest parse_completion(const OrderedJson& body, const tokenizer::Tokenizer& tok, const ApiLimits& lim);
CompletionRequest parse_chat(const OrderedJson& body, const tokenizer::Tokenizer& tok, const ApiLimits& lim,
                             const chat::Renderer& render);
// Renders normalized messages with a request's chat_template_kwargs; errors become ApiError 400.
chat::Prompt render_chat(const chat::Renderer& render, const OrderedJson& messages, const OrderedJson& kwargs);
// Checks chat messages' shape (role, content as a string or text parts) and returns them with
// content joined into plain strings.
OrderedJson normalize_messages(const OrderedJson& messages);

}  // namespace kiln::server
