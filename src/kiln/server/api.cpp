// Request validation: every field is checked for type and range, and every failure becomes an
// ApiError naming the parameter, so a bad request gets a 400 and never reaches the engine.
#include "kiln/server/api.h"

#include <algorithm>
#include <cmath>

#include "kiln/engine/speculative.h"
#include "kiln/server/reasoning.h"

namespace kiln::server {

ApiError::ApiError(int status_, std::string message, std::string param_, std::string code_, std::string type_)
    : std::runtime_error(std::move(message)), status(status_), type(std::move(type_)), param(std::move(param_)),
      code(std::move(code_)) {
  if (type.empty()) type = status == 401 ? "authentication_error"
                           : status == 404 ? "not_found_error"
                           : status >= 500 ? "server_error"
                                           : "invalid_request_error";
}

Json ApiError::to_json() const {
  Json e = {{"message", what()}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return Json{{"error", e}};
}

OrderedJson parse_body(const std::string& body) {
  OrderedJson j;
  try {
    j = OrderedJson::parse(body);
  } catch (const OrderedJson::parse_error& e) {
    throw ApiError(400, std::string("the request body is not valid JSON (UTF-8): ") + e.what(), "", "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object", "", "invalid_json");
  return j;
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError(400, "'" + param + "': " + msg, param, "invalid_value");
}

const OrderedJson* field(const OrderedJson& b, const char* key) {
  auto it = b.find(key);
  return it == b.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number(const OrderedJson& b, const char* key, double lo, double hi, bool lo_open = false) {
  const OrderedJson* v = field(b, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(key, "expected a number, got " + std::string(v->type_name()));
  double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
    bad(key, fmt::format("{} is out of range; it must be in {}{}, {}]", x, lo_open ? "(" : "[", lo, hi));
  return x;
}

std::optional<int64_t> integer(const OrderedJson& b, const char* key, int64_t lo, int64_t hi) {
  const OrderedJson* v = field(b, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) {
    // 3.0 is an integer to most clients' JSON encoders.
    if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() && std::fabs(v->get<double>()) < 9e15) {
    } else {
      bad(key, "expected an integer, got " + std::string(v->type_name()));
    }
  }
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) bad(key, "is out of range");
  int64_t x = v->is_number_float() ? static_cast<int64_t>(v->get<double>()) : v->get<int64_t>();
  if (x < lo || x > hi) bad(key, fmt::format("{} is out of range; it must be in [{}, {}]", x, lo, hi));
  return x;
}

std::optional<bool> boolean(const OrderedJson& b, const char* key) {
  const OrderedJson* v = field(b, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(key, "expected true or false, got " + std::string(v->type_name()));
  return v->get<bool>();
}

std::optional<std::string> string(const OrderedJson& b, const char* key) {
  const OrderedJson* v = field(b, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad(key, "expected a string, got " + std::string(v->type_name()));
  return v->get<std::string>();
}

std::vector<int32_t> token_ids(const OrderedJson& arr, const ApiLimits& lim, const char* param) {
  std::vector<int32_t> ids;
  for (const OrderedJson& t : arr) {
    if (!t.is_number_integer()) bad(param, "token ids must be integers");
    int64_t id = t.is_number_unsigned() && t.get<uint64_t>() > INT64_MAX ? INT64_MAX : t.get<int64_t>();
    if (id < 0 || id >= lim.vocab_size)
      bad(param, fmt::format("token id {} is outside the vocabulary (0..{})", id, lim.vocab_size - 1));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// Encodes a text prompt as `kiln generate` does: with the tokenizer's special tokens (BOS); an
// empty prompt becomes BOS alone.
std::vector<int32_t> encode_prompt(const std::string& text, const tokenizer::Tokenizer& tok, bool add_special) {
  std::vector<int32_t> ids = tok.encode(text, add_special);
  if (ids.empty() && tok.bos_id()) ids.push_back(*tok.bos_id());
  return ids;
}

// response_format (OpenAI's shapes), grammar (GBNF) and regex: at most one of them constrains the
// output. Schemas compile as XGrammar's strict mode does: an object without "additionalProperties"
// takes only its declared properties (JSON Schema would allow others; the output is valid either way).
std::optional<GrammarRequest> parse_grammar(const OrderedJson& b) {
  std::vector<GrammarRequest> found;
  if (const OrderedJson* rf = field(b, "response_format")) {
    if (!rf->is_object()) bad("response_format", "expected an object with a \"type\"");
    const OrderedJson* type = field(*rf, "type");
    if (!type || !type->is_string())
      bad("response_format.type", "expected \"text\", \"json_object\" or \"json_schema\"");
    const std::string t = type->get<std::string>();
    GrammarRequest g;
    g.param = "response_format";
    g.options.additional_properties = false;
    if (t == "json_object") {
      found.push_back(g);
    } else if (t == "json_schema") {
      const OrderedJson* js = field(*rf, "json_schema");
      if (!js || !js->is_object())
        bad("response_format.json_schema", "expected an object {\"name\", \"schema\", \"strict\"}");
      if (const OrderedJson* name = field(*js, "name"); name && !name->is_string())
        bad("response_format.json_schema.name", "expected a string");
      const OrderedJson* schema = field(*js, "schema");
      if (schema && !schema->is_object() && !schema->is_boolean())
        bad("response_format.json_schema.schema", "expected a JSON Schema (an object)");
      g.kind = grammar::Source::json_schema;
      g.text = schema ? schema->dump() : "{}";
      g.options.strict = boolean(*js, "strict").value_or(false);
      g.param = "response_format.json_schema.schema";
      found.push_back(g);
    } else if (t != "text") {
      bad("response_format.type", "'" + t + "' is not one of \"text\", \"json_object\", \"json_schema\"");
    }
  }
  if (auto text = string(b, "grammar")) found.push_back({grammar::Source::gbnf, *text, {}, "grammar"});
  if (auto text = string(b, "regex")) found.push_back({grammar::Source::regex, *text, {}, "regex"});
  if (found.size() > 1)
    bad(found[1].param, "give one of response_format (JSON), grammar and regex, not several");
  if (found.empty()) return std::nullopt;
  return found[0];
}

// Fields both endpoints share: model, sampling, stop, n, stream, max tokens; prompts must be set.
void parse_common(const OrderedJson& b, const ApiLimits& lim, CompletionRequest& r) {
  if (auto m = string(b, "model")) {
    bool known = m->empty();
    for (auto& id : lim.model_ids) known |= *m == id;
    if (!known)
      throw ApiError(404, fmt::format("the model '{}' does not exist; this server serves '{}'", *m, lim.model_ids.at(0)),
                     "model", "model_not_found");
  }
  r.model = lim.model_ids.at(0);
  auto& s = r.sampling;
  s = lim.default_sampling;
  if (auto v = number(b, "temperature", 0, 100)) s.temperature = static_cast<float>(*v);
  if (auto v = number(b, "top_p", 0, 1, true)) s.top_p = static_cast<float>(*v);
  if (auto v = integer(b, "top_k", -1, 1 << 30)) s.top_k = static_cast<int>(std::max<int64_t>(0, *v));
  if (auto v = number(b, "min_p", 0, 1)) s.min_p = static_cast<float>(*v);
  if (auto v = number(b, "repetition_penalty", 0, 100, true)) s.repetition_penalty = static_cast<float>(*v);
  if (auto v = number(b, "presence_penalty", -2, 2)) s.presence_penalty = static_cast<float>(*v);
  if (auto v = number(b, "frequency_penalty", -2, 2)) s.frequency_penalty = static_cast<float>(*v);
  if (auto v = integer(b, "seed", INT64_MIN, INT64_MAX)) s.seed = static_cast<uint64_t>(*v);
  if (const OrderedJson* lb = field(b, "logit_bias")) {
    if (!lb->is_object()) bad("logit_bias", "expected an object mapping token ids to biases");
    if (lb->size() > 1024) bad("logit_bias", "at most 1024 entries");
    for (auto& [k, v] : lb->items()) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(k, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != k.size() || k.empty()) bad("logit_bias", "key '" + k + "' is not a token id");
      if (id < 0 || id >= lim.vocab_size)
        bad("logit_bias", fmt::format("token id {} is outside the vocabulary (0..{})", id, lim.vocab_size - 1));
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < -100 || v.get<double>() > 100)
        bad("logit_bias", "biases must be numbers in [-100, 100]");
      s.logit_bias[static_cast<int32_t>(id)] = v.get<float>();
    }
  }
  if (const OrderedJson* st = field(b, "stop")) {
    if (st->is_string()) {
      r.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (st->size() > 4) bad("stop", fmt::format("at most 4 stop strings, got {}", st->size()));
      for (auto& x : *st) {
        if (!x.is_string()) bad("stop", "expected a string or an array of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "expected a string or an array of strings");
    }
    for (auto& x : r.stop)
      if (x.empty()) bad("stop", "stop strings must not be empty");
  }
  r.n = static_cast<int>(integer(b, "n", 1, lim.max_n).value_or(1));
  r.stream = boolean(b, "stream").value_or(false);
  if (const OrderedJson* so = field(b, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "expected an object");
    r.include_usage = boolean(*so, "include_usage").value_or(false);
  }
  r.return_token_ids = boolean(b, "return_token_ids").value_or(false);
  r.num_draft_tokens = static_cast<int>(integer(b, "num_draft_tokens", 0, engine::kMaxDraftTokens).value_or(-1));
  string(b, "user");
  r.grammar = parse_grammar(b);
  if (const OrderedJson* tl = field(b, "tools"); tl && !(tl->is_array() && tl->empty()))
    throw ApiError(400, "'tools' (tool calls) are not supported yet", "tools", "unsupported_parameter");
  if (const OrderedJson* fn = field(b, "functions"); fn && !(fn->is_array() && fn->empty()))
    throw ApiError(400, "'functions' (tool calls) are not supported yet", "functions", "unsupported_parameter");

  if (r.choices() > lim.max_n) bad("n", fmt::format("n x prompts is {}; at most {}", r.choices(), lim.max_n));
  // Max tokens: a value given must fit beside the prompt in the context; the default is clipped.
  std::optional<int64_t> mt = integer(b, "max_completion_tokens", 0, INT32_MAX);
  const char* mt_name = "max_completion_tokens";
  if (!mt) {
    mt = integer(b, "max_tokens", 0, INT32_MAX);
    mt_name = "max_tokens";
  }
  size_t longest = 0;
  for (auto& p : r.prompts) longest = std::max(longest, p.size());
  if (static_cast<int64_t>(longest) >= lim.context_length)
    throw ApiError(400, fmt::format("the prompt has {} tokens; the model's context is {} tokens", longest, lim.context_length),
                   r.chat ? "messages" : "prompt", "context_length_exceeded");
  int64_t room = lim.context_length - static_cast<int64_t>(longest);
  if (mt && *mt > room)
    throw ApiError(400, fmt::format("{} is {} but the prompt ({} tokens) leaves room for {} in the model's context of {}",
                                    mt_name, *mt, longest, room, lim.context_length),
                   mt_name, "context_length_exceeded");
  r.max_tokens = static_cast<int>(mt ? *mt : std::min<int64_t>(lim.default_max_tokens, room));
}

}  // namespace

CompletionRequest parse_completion(const OrderedJson& b, const tokenizer::Tokenizer& tok, const ApiLimits& lim) {
  CompletionRequest r;
  const OrderedJson* p = field(b, "prompt");
  if (!p) throw ApiError(400, "'prompt' is required", "prompt", "missing_required_parameter");
  auto add_text = [&](const std::string& s) {
    r.prompts.push_back(encode_prompt(s, tok, true));
    r.prompt_texts.push_back(s);
  };
  auto add_ids = [&](const OrderedJson& arr) {
    if (arr.empty()) bad("prompt", "a token-id prompt must not be empty");
    r.prompts.push_back(token_ids(arr, lim, "prompt"));
    r.prompt_texts.push_back(tok.decode(r.prompts.back(), false));
  };
  if (p->is_string()) {
    add_text(p->get<std::string>());
  } else if (p->is_array()) {
    if (p->empty()) bad("prompt", "the prompt array is empty");
    if ((*p)[0].is_number()) {
      add_ids(*p);
    } else {
      if (p->size() > static_cast<size_t>(lim.max_n)) bad("prompt", fmt::format("at most {} prompts", lim.max_n));
      for (const OrderedJson& x : *p) {
        if (x.is_string()) add_text(x.get<std::string>());
        else if (x.is_array()) add_ids(x);
        else bad("prompt", "expected a string, an array of strings, an array of token ids, or an array of those");
      }
    }
  } else {
    bad("prompt", "expected a string, an array of strings, an array of token ids, or an array of those");
  }
  parse_common(b, lim, r);
  if (const OrderedJson* lp = field(b, "logprobs")) {
    if (lp->is_boolean()) r.logprobs = lp->get<bool>() ? 0 : -1;  // some clients send true
    else r.logprobs = static_cast<int>(*integer(b, "logprobs", 0, lim.max_logprobs));
  }
  r.echo = boolean(b, "echo").value_or(false);
  if (auto sfx = string(b, "suffix"); sfx && !sfx->empty())
    throw ApiError(400, "'suffix' (insertion) is not supported", "suffix", "unsupported_parameter");
  if (auto bo = integer(b, "best_of", 1, lim.max_n); bo && *bo != r.n)
    throw ApiError(400, "'best_of' other than n is not supported", "best_of", "unsupported_parameter");
  return r;
}

OrderedJson normalize_messages(const OrderedJson& messages) {
  if (!messages.is_array()) bad("messages", "expected an array of messages");
  if (messages.empty()) bad("messages", "at least one message is required");
  OrderedJson out = OrderedJson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const OrderedJson& m = messages[i];
    std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(where, "each message must be an object");
    auto role = string(m, "role");
    if (!role) bad(where + ".role", "is required");
    static const char* roles[] = {"system", "user", "assistant", "tool", "developer", "function"};
    if (std::find(std::begin(roles), std::end(roles), *role) == std::end(roles))
      bad(where + ".role", "unknown role '" + *role + "'");
    OrderedJson nm = m;
    const OrderedJson* c = field(m, "content");
    if (!c) {
      if (*role != "assistant") bad(where + ".content", "is required");
      nm["content"] = "";
    } else if (c->is_array()) {  // text parts are joined
      std::string text;
      for (const OrderedJson& part : *c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          bad(where + ".content", "only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
        text += part["text"].get<std::string>();
      }
      nm["content"] = text;
    } else if (!c->is_string()) {
      bad(where + ".content", "expected a string or an array of text parts");
    }
    out.push_back(std::move(nm));
  }
  return out;
}

CompletionRequest parse_chat(const OrderedJson& b, const tokenizer::Tokenizer& tok, const ApiLimits& lim,
                             const chat::Renderer& render) {
  CompletionRequest r;
  r.chat = true;
  const OrderedJson* m = field(b, "messages");
  if (!m) throw ApiError(400, "'messages' is required", "messages", "missing_required_parameter");
  OrderedJson messages = normalize_messages(*m);
  OrderedJson kwargs = OrderedJson::object();
  if (const OrderedJson* k = field(b, "chat_template_kwargs")) {
    if (!k->is_object()) bad("chat_template_kwargs", "expected an object");
    kwargs = *k;
  }
  chat::Prompt chat = render_chat(render, messages, kwargs);
  r.prompts.push_back(encode_prompt(chat.text, tok, chat.add_special_tokens));
  if (r.prompts.back().empty()) bad("messages", "the messages render to an empty prompt");
  r.prompt_texts.push_back(chat.text);
  r.reasoning = render.chat_template() && render.chat_template()->thinks();
  r.reasoning_open = r.reasoning && prompt_opens_reasoning(chat.text);
  parse_common(b, lim, r);
  if (auto lp = boolean(b, "logprobs"); lp && *lp) r.logprobs = 0;
  if (auto tl = integer(b, "top_logprobs", 0, lim.max_logprobs)) {
    if (r.logprobs < 0) bad("top_logprobs", "needs \"logprobs\": true");
    r.logprobs = static_cast<int>(*tl);
  }
  return r;
}

chat::Prompt render_chat(const chat::Renderer& render, const OrderedJson& messages, const OrderedJson& kwargs) {
  if (!render.chat_template()) return render.render(messages);  // the fallback (contents joined by newlines)
  if (auto it = kwargs.find("add_generation_prompt"); it != kwargs.end() && !it->is_boolean())
    throw ApiError(400, "'add_generation_prompt' must be true or false", "add_generation_prompt", "invalid_value");
  try {
    return render.render(messages, kwargs);
  } catch (const std::exception& e) {
    throw ApiError(400, std::string("the chat template failed on these messages: ") + e.what(), "messages",
                   "template_error");
  }
}

}  // namespace kiln::server
