// `kiln serve`'s HTTP side: an OpenAI-compatible server over cpp-httplib. A pool of HTTP threads
// parses and validates requests and posts them to the EngineThread; each request's tokens come
// back through its Channel and go out as JSON or server-sent events. No tensor work here.
#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kiln/engine/engine_thread.h"
#include "kiln/server/api.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace kiln::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port (see Server::port())
  std::string api_key;                   // "": no authentication
  std::string cors_origin;               // "": no CORS headers
  size_t max_body_bytes = 8u << 20;      // larger bodies get 413
  double request_timeout_s = 600;        // a request still running after this is cancelled
  int http_threads = 64;                 // each open stream holds one
  int max_queue = 256;                   // requests waiting or running; more get 503
  std::vector<int32_t> stop_ids;         // EOS ids
};

// Prometheus counters kept by the HTTP side (the engine's come from its snapshot).
struct HttpCounters {
  std::mutex mu;
  std::map<int, int64_t> by_status;      // HTTP status -> responses
  int64_t cancelled = 0;                 // requests cancelled because the client went away
};

class Server {
 public:
  Server(ServerConfig cfg, const tokenizer::Tokenizer& tok, engine::EngineThread& engine, ApiLimits limits,
         chat::Renderer render);
  ~Server();
  // Binds the socket (throws kiln::Error when it cannot); port() is known afterwards.
  void bind();
  int port() const { return port_; }
  // Serves until stop() (from a signal handler's thread or another thread).
  void listen();
  void stop();

 private:
  struct Ctx;
  void routes();
  void completion(const httplib::Request& req, httplib::Response& res, bool chat);
  std::string metrics_text();

  ServerConfig cfg_;
  const tokenizer::Tokenizer& tok_;
  engine::EngineThread& engine_;
  ApiLimits lim_;
  chat::Renderer render_;
  // Structured output: the tokenizer's TokenTable (built once) and the compiled grammars by text.
  std::unique_ptr<grammar::GrammarCache> grammars_;
  std::unique_ptr<httplib::Server> http_;
  HttpCounters counters_;
  std::atomic<int> active_{0};  // completion requests in flight
  std::atomic<bool> stopping_{false};  // stop() was called: requests in flight end with 503
  int port_ = 0;
};

}  // namespace kiln::server
