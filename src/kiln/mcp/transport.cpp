// The stdio and Streamable HTTP transports (transport.h).
#include "kiln/mcp/transport.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "kiln/base/log.h"
#include "kiln/hub/http.h"

extern char** environ;

namespace kiln::mcp {

namespace {

Json message(int64_t id, const std::string& method, const Json& params) {
  Json m = {{"jsonrpc", "2.0"}, {"method", method}};
  if (id >= 0) m["id"] = id;
  if (!params.is_null()) m["params"] = params;
  return m;
}

// A JSON-RPC answer's result, or its error as an McpError (the server is still there).
Json result_of(const Json& reply, const std::string& server, const std::string& method) {
  if (reply.contains("error")) {
    const Json& e = reply["error"];
    const int code = e.is_object() ? e.value("code", 0) : 0;
    const std::string msg = e.is_object() ? e.value("message", std::string("?")) : e.dump();
    throw McpError(fmt::format("server '{}' answered {} with error {}: {}", server, method, code, msg), false);
  }
  if (!reply.contains("result"))
    throw McpError(fmt::format("server '{}' answered {} without a result", server, method), false);
  return reply["result"];
}

class StdioTransport final : public Transport {
 public:
  explicit StdioTransport(const ServerSpec& s) : name_(s.name) {
    // A write to a server that has exited must fail with EPIPE, not kill kiln with SIGPIPE.
    signal(SIGPIPE, SIG_IGN);
    int in[2], out[2], err[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC))
      fail("mcp", "server '{}': cannot create pipes: {}", s.name, std::strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      if (!s.env.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
    }
    for (auto& [k, v] : s.env) env.push_back(k + "=" + v);
    std::vector<char*> argv{const_cast<char*>(s.command.c_str())}, envp;
    for (const std::string& a : s.args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const int rc = posix_spawnp(&pid_, s.command.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]), close(out[1]), close(err[1]);
    if (rc != 0) {
      close(in[1]), close(out[0]), close(err[0]);
      fail("mcp", "server '{}': cannot start `{}`: {} (is it installed and on PATH?)", s.name, s.command,
           std::strerror(rc));
    }
    to_child_ = in[1];
    reader_ = std::thread([this, fd = out[0]] { read_loop(fd); });
    stderr_ = std::thread([this, fd = err[0]] { stderr_loop(fd); });
  }

  ~StdioTransport() override {
    close(to_child_);  // the server's stdin ends: MCP's shutdown for stdio
    if (!wait_exit(2.0)) {
      kill(pid_, SIGTERM);
      if (!wait_exit(2.0)) kill(pid_, SIGKILL), wait_exit(-1);
    }
    reader_.join();
    stderr_.join();
  }

  Json request(const std::string& method, const Json& params, double timeout_s) override {
    std::unique_lock lk(mu_);
    const int64_t id = next_id_++;
    if (closed_) throw McpError(fmt::format("server '{}' has exited{}", name_, exit_text()), true);
    write_line(message(id, method, params));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!replies_.count(id) && !closed_)
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && !replies_.count(id)) {
        // The answer may still come: it is dropped then (its id is no longer awaited).
        throw McpError(fmt::format("server '{}' did not answer {} within {} s", name_, method, timeout_s), false);
      }
    if (!replies_.count(id))
      throw McpError(fmt::format("server '{}' exited during {}{}", name_, method, exit_text()), true);
    Json reply = std::move(replies_[id]);
    replies_.erase(id);
    lk.unlock();
    return result_of(reply, name_, method);
  }

  void notify(const std::string& method, const Json& params) override {
    std::lock_guard lk(mu_);
    if (!closed_) write_line(message(-1, method, params));
  }

  bool alive() const override {
    std::lock_guard lk(mu_);
    return !closed_;
  }

 private:
  void write_line(const Json& m) {  // (mu_ held)
    const std::string line = m.dump() + "\n";
    for (size_t off = 0; off < line.size();) {
      const ssize_t n = write(to_child_, line.data() + off, line.size() - off);
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        closed_ = true;  // EPIPE: the reader sees the end too
        return;
      }
      off += static_cast<size_t>(n);
    }
  }

  void read_loop(int fd) {
    std::string buf;
    char chunk[65536];
    for (;;) {
      const ssize_t n = read(fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      buf.append(chunk, static_cast<size_t>(n));
      for (size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1)) on_line(buf.substr(0, nl));
    }
    close(fd);
    std::lock_guard lk(mu_);
    closed_ = true;
    cv_.notify_all();
  }

  void on_line(const std::string& line) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) return;
    Json m = Json::parse(line, nullptr, false);
    if (m.is_discarded() || !m.is_object()) {
      log::warn("mcp {}: a line that is not JSON-RPC on stdout: {}", name_, line.substr(0, 200));
      return;
    }
    if (m.contains("method")) {  // the server's own request or notification
      if (m.contains("id")) {
        std::lock_guard lk(mu_);
        Json reply = {{"jsonrpc", "2.0"}, {"id", m["id"]}};
        if (m["method"] == "ping") reply["result"] = Json::object();
        else reply["error"] = {{"code", -32601}, {"message", "kiln does not offer " + m["method"].dump()}};
        write_line(reply);
      }
      return;
    }
    if (!m.contains("id") || !m["id"].is_number_integer()) return;
    std::lock_guard lk(mu_);
    const int64_t id = m["id"].get<int64_t>();
    if (id < next_id_) replies_[id] = std::move(m);
    cv_.notify_all();
  }

  void stderr_loop(int fd) {
    std::string buf;
    char chunk[4096];
    for (;;) {
      const ssize_t n = read(fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      buf.append(chunk, static_cast<size_t>(n));
      for (size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1))
        log::info("mcp {}: {}", name_, buf.substr(0, nl));
    }
    close(fd);
  }

  // Waits for the child (seconds; < 0: forever); records its status.
  bool wait_exit(double seconds) {
    for (double waited = 0;; waited += 0.02) {
      int st = 0;
      const pid_t r = waitpid(pid_, &st, seconds < 0 ? 0 : WNOHANG);
      if (r == pid_) {
        std::lock_guard lk(mu_);
        status_ = st;
        return true;
      }
      if (r < 0) return true;
      if (waited >= seconds) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  std::string exit_text() {  // (mu_ held; called once the pipe has closed)
    // The pipe closes while the child exits: its status may lag a moment behind.
    for (int i = 0; status_ < 0 && i < 50; ++i) {
      int st = 0;
      const pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_) status_ = st;
      else if (r < 0) break;
      else std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (status_ < 0) return "";
    if (WIFEXITED(status_)) return fmt::format(" (exit status {})", WEXITSTATUS(status_));
    if (WIFSIGNALED(status_)) return fmt::format(" (killed by signal {})", WTERMSIG(status_));
    return "";
  }

  std::string name_;
  pid_t pid_ = -1;
  int to_child_ = -1;
  int status_ = -1;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, Json> replies_;
  int64_t next_id_ = 1;
  bool closed_ = false;
  std::thread reader_, stderr_;
};

class HttpTransport final : public Transport {
 public:
  explicit HttpTransport(const ServerSpec& s) : spec_(s), http_(hub::RetryPolicy{1, 0.5}) {}

  Json request(const std::string& method, const Json& params, double timeout_s) override {
    std::lock_guard lk(mu_);
    const int64_t id = next_id_++;
    const hub::HttpResponse r = post(message(id, method, params), timeout_s);
    if (r.status == 0) throw McpError(fmt::format("server '{}' ({}): {}", spec_.name, spec_.url, r.error), true);
    if (r.status == 404 && !session_.empty()) session_.clear();  // the session expired: initialize again
    if (r.status < 200 || r.status >= 300)
      throw McpError(fmt::format("server '{}' answered {} with HTTP {}: {}", spec_.name, method, r.status,
                                 r.body.substr(0, 200)),
                     r.status == 404 || r.status >= 500);
    if (std::string sid = r.header("mcp-session-id"); !sid.empty()) session_ = sid;
    return result_of(reply_for(r, id, method), spec_.name, method);
  }

  void notify(const std::string& method, const Json& params) override {
    std::lock_guard lk(mu_);
    post(message(-1, method, params), 30);
  }

  bool alive() const override { return true; }  // (each request connects; a failure says dead())

 private:
  hub::HttpResponse post(const Json& m, double timeout_s) {
    hub::HttpRequest q;
    q.method = "POST";
    q.url = spec_.url;
    q.body = m.dump();
    q.timeout_s = static_cast<long>(timeout_s + 0.999);
    q.headers = {"Content-Type: application/json", "Accept: application/json, text/event-stream",
                 "MCP-Protocol-Version: 2025-06-18"};
    if (!session_.empty()) q.headers.push_back("Mcp-Session-Id: " + session_);
    for (auto& [k, v] : spec_.headers) q.headers.push_back(k + ": " + v);
    return http_.send_once(q);
  }

  // The answer with this id: the JSON body, or the SSE stream's message carrying it.
  Json reply_for(const hub::HttpResponse& r, int64_t id, const std::string& method) {
    if (r.header("content-type").find("text/event-stream") == std::string::npos) {
      Json j = Json::parse(r.body, nullptr, false);
      if (j.is_discarded()) throw McpError(fmt::format("server '{}' answered {} with invalid JSON", spec_.name, method), false);
      return j;
    }
    std::string data;
    auto flush = [&]() -> Json {
      Json j = data.empty() ? Json() : Json::parse(data, nullptr, false);
      data.clear();
      return j;
    };
    size_t b = 0;
    while (b <= r.body.size()) {
      size_t e = r.body.find('\n', b);
      if (e == std::string::npos) e = r.body.size();
      std::string line = r.body.substr(b, e - b);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      b = e + 1;
      if (line.rfind("data:", 0) == 0) {
        data += (data.empty() ? "" : "\n") + line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
      } else if (line.empty() || b > r.body.size()) {
        Json j = flush();
        if (j.is_object() && j.contains("id") && j["id"] == id) return j;
      }
    }
    throw McpError(fmt::format("server '{}' ended its event stream without answering {}", spec_.name, method), false);
  }

  ServerSpec spec_;
  hub::HttpClient http_;
  std::mutex mu_;
  std::string session_;
  int64_t next_id_ = 1;
};

}  // namespace

std::unique_ptr<Transport> connect(const ServerSpec& s) {
  if (!s.command.empty()) return std::make_unique<StdioTransport>(s);
  return std::make_unique<HttpTransport>(s);
}

}  // namespace kiln::mcp
