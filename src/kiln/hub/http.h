// The HTTP client the Hub code talks through: one libcurl easy handle per HttpClient (one per thread),
// redirects followed (curl drops the Authorization header when a redirect leaves the host, as the
// Hub's LFS/CDN redirects need), and retries with exponential backoff on connection errors, 429 and 5xx.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kiln::hub {

struct HttpRequest {
  std::string method = "GET";
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  std::string body;                  // POST/PUT body, unless body_file is set
  // A PUT/POST body read from [body_offset, body_offset + body_length) of a file (LFS parts), streamed.
  std::string body_file;
  uint64_t body_offset = 0, body_length = 0;
  // When set, a 2xx response's body goes here as it arrives, with the status (200 or 206: a download
  // that asked for a Range learns whether the server honoured it); false aborts the transfer.
  // Other responses' bodies are still collected into HttpResponse::body (the error text).
  std::function<bool(long status, const char* data, size_t n)> sink;
  // Told the bytes of the request body sent so far (uploads), from libcurl's progress callback.
  std::function<void(uint64_t sent)> on_upload_progress;
  long timeout_s = 0;  // 0: none (large transfers); connections always time out after 30 s
};

struct HttpResponse {
  long status = 0;    // 0: no HTTP answer (connection error, aborted transfer); see error
  std::string error;  // curl's message when status is 0 or the transfer broke off
  bool transfer_ok = false;  // the whole body arrived (curl returned CURLE_OK)
  std::map<std::string, std::string> headers;  // the final response's, names lowercased
  std::string body;
  std::string header(const std::string& lower_name) const;
  bool ok() const { return transfer_ok && status >= 200 && status < 300; }
};

// Retries: attempts after the first, and the first backoff (doubled each time, capped at 8 s).
struct RetryPolicy {
  int max_retries = 5;
  double first_delay_s = 1.0;
};

// True for what a retry may cure: no answer / broken transfer, 408, 429 and 5xx.
bool retryable(const HttpResponse& r);

class HttpClient {
 public:
  explicit HttpClient(RetryPolicy retry = {});
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // One attempt.
  HttpResponse send_once(const HttpRequest& req);
  // send_once, retried while retryable(); the last response is returned (the caller judges it).
  // For requests without a sink (a download resumes itself with Range: see download.h).
  HttpResponse send(const HttpRequest& req);
  // Sleeps the backoff of retry number `attempt` (0-based) and reports it on stderr.
  void backoff(int attempt, const std::string& what, const HttpResponse& r) const;
  const RetryPolicy& retry_policy() const { return retry_; }

 private:
  void* curl_;
  RetryPolicy retry_;
};

// Percent-encodes one URL component (a revision: "refs/pr/1" -> "refs%2Fpr%2F1").
std::string url_escape(const std::string& s);
// Percent-encodes each "/"-separated segment of a path, keeping the slashes.
std::string url_escape_path(const std::string& path);

}  // namespace kiln::hub
