// /v1/completions and /v1/chat/completions: submit one engine request per choice (prompts x n),
// turn each choice's token events into text (streaming detokenizer, then stop strings), and
// answer as one JSON body or as server-sent events. A client that leaves (a failed write in a
// stream; a closed socket seen by a peek while a plain request waits) cancels the request at
// once, which frees its KV blocks.
#include <httplib.h>

#include <chrono>
#include <random>

#include "kiln/base/log.h"
#include "kiln/server/client_socket.h"
#include "kiln/server/reasoning.h"
#include "kiln/server/server.h"
#include "kiln/server/stop_matcher.h"

namespace kiln::server {

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}", prefix, rng());
}

struct LogprobEntry {
  int32_t token;
  float logprob;
  std::vector<engine::TokenLogprob> top;
};

// One choice's progress: its tokens, the text emitted so far and what is still to send.
// text: the content; reasoning: a thinking model's <think> block (split off when req.reasoning).
struct Choice {
  int index = 0, prompt = 0;
  std::unique_ptr<tokenizer::StreamDecoder> detok;
  std::unique_ptr<StopMatcher> stop;
  std::unique_ptr<ReasoningSplitter> think;  // null: no split, all text is content
  std::string text, unsent, reasoning, unsent_reasoning;
  std::vector<int32_t> tokens;
  std::vector<LogprobEntry> lps;
  size_t lps_sent = 0, tokens_sent = 0;
  std::vector<std::vector<engine::TokenLogprob>> prompt_lp;
  const char* finish = nullptr;  // set when done
  bool started = false, first_chunk_sent = false;
  int n_cached = 0, n_cached_ssd = 0;
  int draft_n = 0, draft_n_accepted = 0;  // speculative decoding: the engine's running totals
  Clock::time_point t_first, t_last;
};

}  // namespace

// The state of one completion request, shared by the handler and (for streams) the content provider.
struct Server::Ctx {
  CompletionRequest req;
  std::shared_ptr<engine::Channel> ch = std::make_shared<engine::Channel>();
  std::vector<Choice> choices;
  std::string id;
  int64_t created = 0;
  Clock::time_point t_submit, deadline;
  std::shared_ptr<const grammar::TokenMasker> grammar;  // structured output, or null
  std::vector<std::string> warnings;  // JSON Schema keywords not enforced (the response's "warnings")
  std::string error;
  int error_status = 0;
  bool cancelled = false;
  int n_done = 0;

  // Decided text (past the stop strings) -> the choice's content and reasoning.
  static void add_text(Choice& c, const std::string& piece, bool last) {
    ReasoningSplitter::Piece p{"", piece};
    if (c.think) {
      p = c.think->push(piece);
      if (last) {
        ReasoningSplitter::Piece rest = c.think->flush();
        p.reasoning += rest.reasoning;
        p.content += rest.content;
      }
    }
    c.text += p.content;
    c.unsent += p.content;
    c.reasoning += p.reasoning;
    c.unsent_reasoning += p.reasoning;
  }

  std::string token_text(const tokenizer::Tokenizer& tok, int32_t id) const {
    int32_t one[1] = {id};
    return tok.decode(one, false);
  }

  // Applies one engine event to its choice. Returns true when the choice just finished.
  bool apply(const tokenizer::Tokenizer& tok, engine::EngineThread& et, int ci, const engine::TokenEvent& e,
             Clock::time_point now) {
    Choice& c = choices[ci];
    if (c.finish) return false;  // a stop string ended it already; late events are dropped
    if (!c.started) {
      c.started = true;
      c.t_first = now;
      c.n_cached = e.n_cached;
      c.n_cached_ssd = e.n_cached_ssd;
      c.prompt_lp = e.prompt_logprobs;
    }
    c.t_last = now;
    // Every sampled token's event carries the totals so far; an end-only event (cancel, error) carries 0.
    c.draft_n = std::max(c.draft_n, e.draft_n);
    c.draft_n_accepted = std::max(c.draft_n_accepted, e.draft_n_accepted);
    if (e.reason == engine::FinishReason::error) {
      error = e.error;
      error_status = e.request_id == 0 ? 400 : 500;  // 0: the engine refused it before running
      c.finish = "error";
      return true;
    }
    if (e.token >= 0) {
      c.tokens.push_back(e.token);
      if (req.logprobs >= 0) c.lps.push_back({e.token, e.logprob, e.top});
      if (e.reason != engine::FinishReason::stop) {  // an EOS token is not text
        std::string piece = c.stop->push(c.detok->push(e.token));
        add_text(c, piece, c.stop->stopped());
        if (c.stop->stopped()) {
          c.finish = "stop";
          if (!e.finished) et.cancel(ch, ci);
          return true;
        }
      }
    }
    if (e.finished) {
      std::string rest = c.stop->push(c.detok->flush());
      if (!c.stop->stopped()) rest += c.stop->flush();
      add_text(c, rest, true);
      c.finish = (e.reason == engine::FinishReason::stop || c.stop->stopped()) ? "stop" : "length";
      return true;
    }
    return false;
  }

  Json logprobs_json(const tokenizer::Tokenizer& tok, const Choice& c, size_t from, bool with_prompt) const {
    if (req.logprobs < 0) return nullptr;
    if (req.chat) {
      Json content = Json::array();
      for (size_t i = from; i < c.lps.size(); ++i) {
        auto entry = [&](int32_t id, float lp) {
          std::string s = token_text(tok, id);
          return Json{{"token", s}, {"logprob", lp}, {"bytes", std::vector<uint8_t>(s.begin(), s.end())}};
        };
        Json e = entry(c.lps[i].token, c.lps[i].logprob);
        Json top = Json::array();
        for (auto& t : c.lps[i].top) top.push_back(entry(t.token, t.logprob));
        e["top_logprobs"] = top;
        content.push_back(e);
      }
      return Json{{"content", content}, {"refusal", nullptr}};
    }
    Json tokens = Json::array(), token_lps = Json::array(), tops = Json::array(), offsets = Json::array();
    size_t offset = 0;  // byte offset of each token's text in the returned text
    auto add = [&](int32_t id, const Json& lp, const std::vector<engine::TokenLogprob>& top, bool has_top) {
      std::string s = token_text(tok, id);
      tokens.push_back(s);
      token_lps.push_back(lp);
      if (has_top) {
        Json d = Json::object();
        for (auto& t : top) d[token_text(tok, t.token)] = t.logprob;
        tops.push_back(d);
      } else {
        tops.push_back(nullptr);
      }
      offsets.push_back(offset);
      offset += s.size();
    };
    if (with_prompt) {
      const auto& ids = req.prompts[c.prompt];
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i == 0 || i >= c.prompt_lp.size() || c.prompt_lp[i].empty()) {
          add(ids[i], nullptr, {}, false);
        } else {
          const auto& e = c.prompt_lp[i];
          add(ids[i], e[0].logprob, std::vector<engine::TokenLogprob>(e.begin() + 1, e.end()), true);
        }
      }
    }
    for (size_t i = from; i < c.lps.size(); ++i) {
      std::vector<engine::TokenLogprob> top = c.lps[i].top;
      add(c.lps[i].token, c.lps[i].logprob, top, true);
    }
    return Json{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  // usage and timings over all choices (each prompt counted once, through its first choice).
  std::pair<Json, Json> usage_json() const {
    int64_t prompt = 0, cached = 0, cached_ssd = 0, completion = 0, drafted = 0, accepted = 0;
    Clock::time_point first = Clock::time_point::max(), last = t_submit;
    for (auto& c : choices) {
      completion += static_cast<int64_t>(c.tokens.size());
      drafted += c.draft_n;
      accepted += c.draft_n_accepted;
      if (c.index % req.n == 0) {
        prompt += static_cast<int64_t>(req.prompts[c.prompt].size());
        cached += c.n_cached;
        cached_ssd += c.n_cached_ssd;
      }
      if (c.started) {
        first = std::min(first, c.t_first);
        last = std::max(last, c.t_last);
      }
    }
    if (first == Clock::time_point::max()) first = last;
    Json usage = {{"prompt_tokens", prompt},
                  {"completion_tokens", completion},
                  {"total_tokens", prompt + completion},
                  {"prompt_tokens_details", {{"cached_tokens", cached}}},
                  {"draft_n", drafted},
                  {"draft_n_accepted", accepted}};
    double prompt_ms = ms_between(t_submit, first), predicted_ms = ms_between(first, last);
    Json timings = {{"prompt_n", prompt - cached},
                    {"cache_n", cached},  // of them read back from the SSD tier (the rest from RAM):
                    {"cache_n_ssd", cached_ssd},
                    {"prompt_ms", prompt_ms},
                    {"prompt_per_second", prompt_ms > 0 ? (prompt - cached) * 1000.0 / prompt_ms : 0.0},
                    {"predicted_n", completion},
                    {"predicted_ms", predicted_ms},
                    {"predicted_per_second", predicted_ms > 0 ? completion * 1000.0 / predicted_ms : 0.0},
                    {"draft_n", drafted},  // llama.cpp's names: tokens drafted and accepted
                    {"draft_n_accepted", accepted}};
    return {usage, timings};
  }

  // with_warnings: the response (or a stream's first chunk) lists the schema keywords not enforced.
  Json base(const char* object, bool with_warnings = false) const {
    Json j = {{"id", id}, {"object", object}, {"created", created}, {"model", req.model}};
    if (with_warnings && !warnings.empty()) j["warnings"] = warnings;
    return j;
  }
};

static std::string sse(const Json& j) {
  return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

void Server::completion(const httplib::Request& hreq, httplib::Response& res, bool chat) {
  auto ctx = std::make_shared<Ctx>();
  OrderedJson body = parse_body(hreq.body);
  ctx->req = chat ? parse_chat(body, tok_, lim_, render_) : parse_completion(body, tok_, lim_);
  const CompletionRequest& r = ctx->req;
  if (engine_.queue_depth() + active_.load() >= cfg_.max_queue)
    throw ApiError(503, "the server is busy (too many requests queued); retry later", "", "server_busy", "server_error");
  if (r.grammar) {  // compiled once per text (the cache), here on the HTTP thread
    try {
      grammar::CompiledSource c = grammars_->get(r.grammar->kind, r.grammar->text, r.grammar->options);
      ctx->grammar = c.masker;
      for (const std::string& w : c.warnings) ctx->warnings.push_back(w);
    } catch (const Error& e) {
      const bool schema = r.grammar->kind == grammar::Source::json_schema;
      throw ApiError(400, fmt::format("'{}': {}", r.grammar->param, e.what()), r.grammar->param,
                     schema && r.grammar->options.strict && std::string_view(e.what()).find("(strict)") != std::string_view::npos
                         ? "unsupported_schema_keyword"
                         : schema ? "invalid_schema" : r.grammar->kind == grammar::Source::gbnf ? "invalid_grammar" : "invalid_regex");
    }
  }

  ctx->id = random_id(chat ? "chatcmpl-" : "cmpl-");
  ctx->created = static_cast<int64_t>(std::time(nullptr));
  ctx->t_submit = Clock::now();
  ctx->deadline = ctx->t_submit + std::chrono::milliseconds(static_cast<int64_t>(cfg_.request_timeout_s * 1000));
  for (int p = 0; p < static_cast<int>(r.prompts.size()); ++p)
    for (int k = 0; k < r.n; ++k) {
      Choice c;
      c.index = p * r.n + k;
      c.prompt = p;
      c.detok = std::make_unique<tokenizer::StreamDecoder>(tok_, true);
      c.stop = std::make_unique<StopMatcher>(r.stop);
      if (r.reasoning) c.think = std::make_unique<ReasoningSplitter>(r.reasoning_open);
      ctx->choices.push_back(std::move(c));
      engine::Request er;
      er.prompt = r.prompts[p];
      er.sampling = r.sampling;
      if (er.sampling.seed && k > 0) *er.sampling.seed += k;  // n choices from one seed still differ
      er.max_tokens = r.max_tokens;
      er.stop_ids = cfg_.stop_ids;
      er.logprobs = r.logprobs;
      er.num_draft_tokens = r.num_draft_tokens;
      er.grammar = ctx->grammar;
      if (r.echo && r.logprobs >= 0) er.prompt_logprobs = r.logprobs;
      engine_.submit(std::move(er), ctx->ch, c.index);
    }
  ++active_;

  // Pumps events until every choice is done; `emit` is called after each batch of events.
  // Returns false when emit fails (the client is gone); a passed deadline or a shutdown sets
  // ctx->error and returns true.
  auto pump = [this, ctx](const std::function<bool(bool)>& emit) -> bool {
    const int n = static_cast<int>(ctx->choices.size());
    while (ctx->n_done < n && ctx->error.empty()) {
      if (stopping_) {
        ctx->error = "the server is shutting down";
        ctx->error_status = 503;
        break;
      }
      if (Clock::now() > ctx->deadline) {
        ctx->error = fmt::format("the request timed out after {} s", cfg_.request_timeout_s);
        ctx->error_status = 504;
        break;
      }
      auto items = ctx->ch->pop(std::chrono::milliseconds(50));
      for (auto& item : items)
        if (ctx->apply(tok_, engine_, item.choice, item.event, item.time)) ++ctx->n_done;
      if (!emit(!items.empty())) return false;
    }
    return true;
  };
  auto finish_request = [this, ctx]() {
    if (ctx->n_done < static_cast<int>(ctx->choices.size()) || !ctx->error.empty()) engine_.cancel(ctx->ch);
    --active_;
  };

  if (!r.stream) {
    // No write shows a closed connection here (the body goes out at the end), so the handler
    // peeks at its socket while it waits: a client gone means cancel now, not at --timeout.
    ClientSocket client = ClientSocket::find(hreq.local_addr, hreq.local_port, hreq.remote_addr, hreq.remote_port);
    if (!client.valid())
      log::debug("no socket found for {}:{}; a disconnect of this request will not cancel it", hreq.remote_addr,
                 hreq.remote_port);
    bool ok = pump([&client](bool) { return !client.peer_closed_throttled(std::chrono::milliseconds(20)); });
    finish_request();
    if (!ok) {
      {
        std::lock_guard<std::mutex> lk(counters_.mu);
        ++counters_.cancelled;
      }
      ctx->cancelled = true;
      // Nobody reads this; 499 (nginx's "client closed request") is what /metrics counts.
      throw ApiError(499, "the client closed the connection before the answer", "", "client_closed_request");
    }
    if (!ctx->error.empty())
      throw ApiError(ctx->error_status ? ctx->error_status : 500, ctx->error.empty() ? "the request failed" : ctx->error);
    Json out = ctx->base(chat ? "chat.completion" : "text_completion", true);
    Json choices = Json::array();
    for (auto& c : ctx->choices) {
      Json j = {{"index", c.index}, {"finish_reason", c.finish}};
      if (chat) {
        j["message"] = {{"role", "assistant"}, {"content", c.text}};
        if (!c.reasoning.empty()) j["message"]["reasoning_content"] = c.reasoning;  // as vLLM: absent when none
        j["logprobs"] = ctx->logprobs_json(tok_, c, 0, false);
      } else {
        j["text"] = r.echo ? r.prompt_texts[c.prompt] + c.text : c.text;
        j["logprobs"] = ctx->logprobs_json(tok_, c, 0, r.echo);
      }
      if (r.return_token_ids) {
        j["token_ids"] = c.tokens;
        j["prompt_token_ids"] = r.prompts[c.prompt];
      }
      choices.push_back(j);
    }
    out["choices"] = choices;
    auto [usage, timings] = ctx->usage_json();
    out["usage"] = usage;
    out["timings"] = timings;
    if (chat && r.return_token_ids) out["prompt_token_ids"] = r.prompts[0];
    res.set_content(out.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
    return;
  }

  // Streaming: the provider runs on this HTTP thread after the handler returns.
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, ctx, chat, pump](size_t, httplib::DataSink& sink) {
        const CompletionRequest& r = ctx->req;
        auto last_write = Clock::now();
        bool warned = false;  // the first chunk carries the warnings
        auto write = [&](const std::string& s) {
          last_write = Clock::now();
          return sink.write(s.data(), s.size());
        };
        auto chunk = [&](Choice& c, bool final) {
          Json j = {{"index", c.index}, {"finish_reason", final ? Json(c.finish) : Json(nullptr)}};
          Json lp = c.lps_sent < c.lps.size() || (final && r.logprobs >= 0) ? ctx->logprobs_json(tok_, c, c.lps_sent, false)
                                                                            : Json(nullptr);
          bool echo_now = !chat && r.echo && !c.first_chunk_sent;
          if (echo_now && r.logprobs >= 0) lp = ctx->logprobs_json(tok_, c, c.lps_sent, true);
          c.lps_sent = c.lps.size();
          if (chat) {
            Json delta = Json::object();
            if (!c.first_chunk_sent) delta["role"] = "assistant";
            if (!c.unsent_reasoning.empty()) delta["reasoning_content"] = c.unsent_reasoning;
            if (!c.unsent.empty() || (!c.first_chunk_sent && c.unsent_reasoning.empty())) delta["content"] = c.unsent;
            j["delta"] = delta;
          } else {
            j["text"] = echo_now ? r.prompt_texts[c.prompt] + c.unsent : c.unsent;
          }
          j["logprobs"] = lp;
          if (final && r.return_token_ids) j["token_ids"] = c.tokens;
          c.unsent.clear();
          c.unsent_reasoning.clear();
          c.tokens_sent = c.tokens.size();
          c.first_chunk_sent = true;
          Json out = ctx->base(chat ? "chat.completion.chunk" : "text_completion", !warned);
          warned = true;
          out["choices"] = Json::array({j});
          return write(sse(out));
        };
        // The reasoning goes out before the content: where one batch of events holds both (the
        // block closed), the reasoning takes a chunk of its own first.
        auto send = [&](Choice& c, bool final) {
          if (!c.unsent_reasoning.empty() && !c.unsent.empty()) {
            std::string content = std::move(c.unsent);
            c.unsent.clear();
            if (!chunk(c, false)) return false;
            c.unsent = std::move(content);
          }
          return chunk(c, final);
        };
        std::vector<bool> final_sent(ctx->choices.size(), false);
        auto emit_chunks = [&]() {
          for (size_t i = 0; i < ctx->choices.size(); ++i) {
            Choice& c = ctx->choices[i];
            if (final_sent[i]) continue;
            // New tokens always make a chunk, even when their text is held back (empty text):
            // clients see progress at once (TTFT), and the write shows whether the client is there.
            bool fresh = c.tokens.size() > c.tokens_sent || !c.unsent.empty() || !c.unsent_reasoning.empty();
            if (c.finish && ctx->error.empty()) {
              if ((fresh || !c.first_chunk_sent) && !send(c, false)) return false;
              if (!chunk(c, true)) return false;
              final_sent[i] = true;
            } else if (fresh) {
              if (!send(c, false)) return false;
            }
          }
          return true;
        };
        // Writes the chunks that are due. When nothing went out for a second (queued), an SSE
        // comment goes out instead: clients ignore it, and a write is how a closed connection shows.
        auto emit = [&](bool progressed) {
          auto before = last_write;
          if (!emit_chunks()) return false;
          if (last_write == before && (progressed || Clock::now() - last_write > std::chrono::seconds(1)))
            return write(": keep-alive\n\n");
          return true;
        };
        bool ok = pump(emit);
        if (ok && !ctx->error.empty()) {
          ApiError e(ctx->error_status ? ctx->error_status : 500, ctx->error);
          ok = write(sse(e.to_json()));
        }
        if (ok && ctx->error.empty() && r.include_usage) {
          Json out = ctx->base(chat ? "chat.completion.chunk" : "text_completion");
          out["choices"] = Json::array();
          auto [usage, timings] = ctx->usage_json();
          out["usage"] = usage;
          out["timings"] = timings;
          ok = write(sse(out));
        }
        if (ok) ok = write("data: [DONE]\n\n");
        if (!ok) {
          std::lock_guard<std::mutex> lk(counters_.mu);
          ++counters_.cancelled;
        }
        ctx->cancelled = !ok;
        if (ok) sink.done();
        return ok;
      },
      [this, ctx, finish_request](bool) { finish_request(); });
}

}  // namespace kiln::server
