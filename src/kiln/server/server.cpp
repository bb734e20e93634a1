// Server: routes, authentication, CORS, errors in OpenAI's shape, and the small routes
// (/v1/models, /health, /metrics, /tokenize, /detokenize, /apply-template).
#include "kiln/server/server.h"

#include <httplib.h>

#include <ctime>

#include "kiln/base/log.h"

namespace kiln::server {

namespace {

// Known paths and their methods: a known path with another method gets 405, anything else 404.
const std::map<std::string, std::string> kRoutes = {
    {"/v1/chat/completions", "POST"}, {"/v1/completions", "POST"}, {"/chat/completions", "POST"},
    {"/completions", "POST"},         {"/v1/models", "GET"},       {"/models", "GET"},
    {"/health", "GET"},               {"/metrics", "GET"},         {"/tokenize", "POST"},
    {"/detokenize", "POST"},          {"/apply-template", "POST"},
};

void send_json(httplib::Response& res, int status, const Json& j) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status, e.to_json());
  if (e.status == 405) res.set_header("Allow", e.param);
}

}  // namespace

Server::Server(ServerConfig cfg, const tokenizer::Tokenizer& tok, engine::EngineThread& engine, ApiLimits limits,
               chat::Renderer render)
    : cfg_(std::move(cfg)), tok_(tok), engine_(engine), lim_(std::move(limits)), render_(std::move(render)),
      grammars_(std::make_unique<grammar::GrammarCache>(grammar::TokenTable::from_tokenizer(tok))),
      http_(std::make_unique<httplib::Server>()) {
  int threads = std::max(4, cfg_.http_threads);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(cfg_.max_body_bytes);
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  http_->set_tcp_nodelay(true);  // SSE chunks are small: no Nagle delay on each token
  routes();
}

Server::~Server() = default;

void Server::routes() {
  auto& s = *http_;
  // Runs before routing: CORS headers, preflight, and the API key.
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!cfg_.cors_origin.empty()) {
      res.set_header("Access-Control-Allow-Origin", cfg_.cors_origin);
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      if (req.method == "OPTIONS") {
        res.status = 204;
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (!cfg_.api_key.empty() && req.path != "/health") {
      std::string auth = req.get_header_value("Authorization");
      if (auth != "Bearer " + cfg_.api_key) {
        send_error(res, ApiError(401, "a valid API key is required: send 'Authorization: Bearer <key>'", "",
                                 "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Every 4xx/5xx without a body (no route, wrong method, body too large, ...) gets a JSON error.
  s.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.content_length_ > 0) return httplib::Server::HandlerResponse::Unhandled;
    auto it = kRoutes.find(req.path);
    if (res.status == 404 && it != kRoutes.end()) {
      res.set_header("Allow", it->second);
      send_json(res, 405, ApiError(405, fmt::format("{} does not allow {}; use {}", req.path, req.method, it->second),
                                   "", "method_not_allowed").to_json());
    } else if (res.status == 404) {
      send_json(res, 404, ApiError(404, fmt::format("no route {} {}", req.method, req.path), "", "not_found").to_json());
    } else if (res.status == 413) {
      send_json(res, 413, ApiError(413, "the request body is too large", "", "payload_too_large").to_json());
    } else {
      send_json(res, res.status, ApiError(res.status, fmt::format("HTTP {}", res.status)).to_json());
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, ApiError(400, e.what()));  // kiln::Error from validation deeper down
    } catch (...) {
      send_error(res, ApiError(500, "internal error"));
    }
  });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lk(counters_.mu);
      ++counters_.by_status[res.status];
    }
    log::debug("{} {} -> {}", req.method, req.path, res.status);
  });

  auto guarded = [](auto fn) {
    return [fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {
        send_error(res, ApiError(400, e.what()));
      }
    };
  };
  for (const char* p : {"/v1/chat/completions", "/chat/completions"})
    s.Post(p, guarded([this](const httplib::Request& q, httplib::Response& r) { completion(q, r, true); }));
  for (const char* p : {"/v1/completions", "/completions"})
    s.Post(p, guarded([this](const httplib::Request& q, httplib::Response& r) { completion(q, r, false); }));
  for (const char* p : {"/v1/models", "/models"})
    s.Get(p, [this](const httplib::Request&, httplib::Response& res) {
      Json data = Json::array();
      data.push_back({{"id", lim_.model_ids.at(0)}, {"object", "model"}, {"created", 0}, {"owned_by", "kiln"},
                      {"max_model_len", lim_.context_length}});
      send_json(res, 200, {{"object", "list"}, {"data", data}});
    });
  s.Get("/health", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, {{"status", "ok"}}); });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  s.Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
    OrderedJson b = parse_body(req.body);
    auto text = b.find("content") != b.end() ? b.find("content") : b.find("prompt");
    if (text == b.end() || !text->is_string())
      throw ApiError(400, "'content' (or 'prompt') must be a string", "content", "invalid_value");
    bool special = true;
    if (auto a = b.find("add_special"); a != b.end()) {
      if (!a->is_boolean()) throw ApiError(400, "'add_special' must be true or false", "add_special", "invalid_value");
      special = a->get<bool>();
    }
    auto ids = tok_.encode(text->get<std::string>(), special);
    send_json(res, 200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", lim_.context_length}});
  }));
  s.Post("/detokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
    OrderedJson b = parse_body(req.body);
    auto t = b.find("tokens");
    if (t == b.end() || !t->is_array()) throw ApiError(400, "'tokens' must be an array of token ids", "tokens", "invalid_value");
    std::vector<int32_t> ids;
    for (auto& x : *t) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= lim_.vocab_size)
        throw ApiError(400, fmt::format("'tokens': {} is not a token id (0..{})", x.dump(), lim_.vocab_size - 1), "tokens",
                       "invalid_value");
      ids.push_back(x.get<int32_t>());
    }
    std::string text = tok_.decode(ids, false);
    send_json(res, 200, {{"content", text}, {"prompt", text}});
  }));
  s.Post("/apply-template", guarded([this](const httplib::Request& req, httplib::Response& res) {
    OrderedJson b = parse_body(req.body);
    auto m = b.find("messages");
    if (m == b.end()) throw ApiError(400, "'messages' is required", "messages", "missing_required_parameter");
    OrderedJson kwargs = b.contains("chat_template_kwargs") && b["chat_template_kwargs"].is_object()
                             ? b["chat_template_kwargs"]
                             : OrderedJson::object();
    if (b.contains("add_generation_prompt")) kwargs["add_generation_prompt"] = b["add_generation_prompt"];
    chat::Prompt chat = render_chat(render_, normalize_messages(*m), kwargs);
    send_json(res, 200, {{"prompt", chat.text}});
  }));
  // Preflight for paths without CORS configured still answers (no headers).
  s.Options(".*", [](const httplib::Request&, httplib::Response& res) { res.status = 204; });
}

std::string Server::metrics_text() {
  engine::EngineSnapshot e = engine_.snapshot();
  std::string o;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
  };
  o += "# HELP kiln_requests_total HTTP responses by status code\n# TYPE kiln_requests_total counter\n";
  {
    std::lock_guard<std::mutex> lk(counters_.mu);
    for (auto& [status, n] : counters_.by_status) o += fmt::format("kiln_requests_total{{status=\"{}\"}} {}\n", status, n);
    metric("kiln_requests_client_disconnected_total", "counter", "Requests cancelled because the client went away",
           static_cast<double>(counters_.cancelled));
  }
  metric("kiln_prompt_tokens_total", "counter", "Prompt tokens computed (cache hits excluded)", static_cast<double>(e.prompt_tokens));
  metric("kiln_generation_tokens_total", "counter", "Tokens generated", static_cast<double>(e.generated_tokens));
  metric("kiln_prefix_cache_hit_tokens_total", "counter", "Prompt tokens reused from the prefix cache",
         static_cast<double>(e.cache_hit_tokens));
  metric("kiln_preemptions_total", "counter", "Sequences preempted (recomputed later)", static_cast<double>(e.preemptions));
  metric("kiln_engine_steps_total", "counter", "Engine steps run", static_cast<double>(e.steps));
  metric("kiln_queue_depth", "gauge", "Requests waiting for admission", e.queued);
  metric("kiln_running_sequences", "gauge", "Sequences in the running batch", e.running);
  metric("kiln_requests_active", "gauge", "Completion requests in flight", active_.load());
  metric("kiln_kv_blocks_used", "gauge", "KV blocks held by sequences", e.blocks_used);
  metric("kiln_kv_blocks_cached", "gauge", "Unreferenced KV blocks kept by the prefix cache", e.blocks_cached);
  metric("kiln_kv_blocks_free", "gauge", "Empty KV blocks", e.blocks_free);
  metric("kiln_kv_blocks_total", "gauge", "KV blocks in the pool", e.blocks_total);
  metric("kiln_generation_tokens_per_second", "gauge", "Tokens generated per second of engine busy time",
         e.busy_seconds > 0 ? e.generated_tokens / e.busy_seconds : 0.0);
  metric("kiln_spec_draft_tokens_total", "counter", "Speculative decoding: draft tokens proposed and verified",
         static_cast<double>(e.draft_tokens));
  metric("kiln_spec_accepted_tokens_total", "counter", "Speculative decoding: draft tokens accepted",
         static_cast<double>(e.accepted_tokens));
  metric("kiln_spec_acceptance_rate", "gauge", "Speculative decoding: accepted / drafted tokens (0 before any draft)",
         e.draft_tokens > 0 ? static_cast<double>(e.accepted_tokens) / e.draft_tokens : 0.0);
  // Accepted drafts per verify (the target also adds a token of its own to each: + 1 per forward).
  metric("kiln_spec_mean_accepted_length", "gauge", "Speculative decoding: draft tokens accepted per verify (0 before any)",
         e.verifies > 0 ? static_cast<double>(e.accepted_tokens) / e.verifies : 0.0);
  if (e.ssd_on) {
    const kvstore::SsdStats& s = e.ssd;
    metric("kiln_ssd_cache_hits_total", "counter", "SSD KV tier: blocks read back instead of recomputed", static_cast<double>(s.hits));
    metric("kiln_ssd_cache_misses_total", "counter", "SSD KV tier: prefix lookups that found no block on disk",
           static_cast<double>(s.misses));
    metric("kiln_ssd_cache_read_bytes_total", "counter", "SSD KV tier: bytes read", static_cast<double>(s.bytes_read));
    metric("kiln_ssd_cache_written_bytes_total", "counter", "SSD KV tier: bytes written", static_cast<double>(s.bytes_written));
    metric("kiln_ssd_cache_blocks", "gauge", "SSD KV tier: block files on disk", static_cast<double>(s.blocks));
    metric("kiln_ssd_cache_bytes", "gauge", "SSD KV tier: bytes on disk", static_cast<double>(s.bytes));
    metric("kiln_ssd_cache_evictions_total", "counter", "SSD KV tier: files deleted to stay under --ssd-cache-bytes",
           static_cast<double>(s.evictions));
    metric("kiln_ssd_cache_rejected_total", "counter",
           "SSD KV tier: files deleted for failing a check (truncated, corrupt, another version or model)",
           static_cast<double>(s.rejected));
    metric("kiln_ssd_cache_dropped_total", "counter", "SSD KV tier: blocks not written (queue full or writing off)",
           static_cast<double>(s.dropped));
    metric("kiln_ssd_cache_writable", "gauge", "SSD KV tier: 1 while blocks are written, 0 after a write failed",
           s.writable ? 1.0 : 0.0);
  }
  return o;
}

void Server::bind() {
  if (cfg_.port == 0) {
    port_ = http_->bind_to_any_port(cfg_.host);
    if (port_ <= 0) fail("serve", "cannot bind {} on any port", cfg_.host);
  } else {
    if (!http_->bind_to_port(cfg_.host, cfg_.port))
      fail("serve", "cannot bind {}:{} (in use, or not an address of this machine); pick another --port", cfg_.host,
           cfg_.port);
    port_ = cfg_.port;
  }
}

void Server::listen() { http_->listen_after_bind(); }

void Server::stop() {
  stopping_ = true;
  http_->stop();
}

}  // namespace kiln::server
