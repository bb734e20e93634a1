// libcurl behind HttpClient: request bodies from memory or a file slice, response bodies into memory
// or a sink, headers lowercased, retries with backoff.
#include "kiln/hub/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "kiln/base/error.h"
#include "kiln/base/version.h"

namespace kiln::hub {
namespace {

std::once_flag g_curl_init;

struct Transfer {
  const HttpRequest* req;
  HttpResponse* resp;
  CURL* curl;
  FILE* body_file = nullptr;
  uint64_t body_left = 0;
  bool sink_failed = false;
  size_t sunk = 0;
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (after a redirect or a 100): forget the last one's
    t->resp->headers.clear();
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  std::string name = line.substr(0, colon), value = line.substr(colon + 1);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  auto trim = [](std::string& s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    size_t i = 0;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    s.erase(0, i);
  };
  trim(value);
  t->resp->headers[name] = value;
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (t->req->sink && status >= 200 && status < 300) {
    if (!t->req->sink(status, data, size * n)) {
      t->sink_failed = true;
      return 0;  // aborts the transfer
    }
    t->sunk += size * n;
  } else {
    t->resp->body.append(data, size * n);
  }
  return size * n;
}

size_t on_read(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t want = std::min<uint64_t>(size * n, t->body_left);
  size_t got = want ? std::fread(buf, 1, want, t->body_file) : 0;
  t->body_left -= got;
  return got;
}

int on_xfer(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t ulnow) {
  auto* t = static_cast<Transfer*>(user);
  t->req->on_upload_progress(static_cast<uint64_t>(ulnow));
  return 0;
}

}  // namespace

std::string HttpResponse::header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

bool retryable(const HttpResponse& r) {
  if (r.status == 0) return true;
  if (r.status == 408 || r.status == 429 || r.status >= 500) return true;
  return r.status >= 200 && r.status < 300 && !r.transfer_ok;  // broken off mid-body
}

HttpClient::HttpClient(RetryPolicy retry) : retry_(retry) {
  std::call_once(g_curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  curl_ = curl_easy_init();
  if (!curl_) fail("hub", "cannot initialize libcurl");
}

HttpClient::~HttpClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

HttpResponse HttpClient::send_once(const HttpRequest& req) {
  CURL* c = static_cast<CURL*>(curl_);
  curl_easy_reset(c);
  HttpResponse resp;
  Transfer t{&req, &resp, c};
  curl_slist* hdrs = nullptr;
  for (const auto& h : req.headers) hdrs = curl_slist_append(hdrs, h.c_str());
  curl_easy_setopt(c, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
  // A stalled transfer (under 1 byte/s for 60 s) counts as a connection error and is retried.
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  if (req.timeout_s > 0) curl_easy_setopt(c, CURLOPT_TIMEOUT, req.timeout_s);
  const std::string ua = std::string("kiln/") + kVersion;
  curl_easy_setopt(c, CURLOPT_USERAGENT, ua.c_str());
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  if (!req.body_file.empty()) {
    t.body_file = std::fopen(req.body_file.c_str(), "rb");
    if (!t.body_file) fail("hub", "cannot read {}", req.body_file);
    std::fseek(t.body_file, static_cast<long>(req.body_offset), SEEK_SET);
    t.body_left = req.body_length;
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(c, CURLOPT_READDATA, &t);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body_length));
    hdrs = curl_slist_append(hdrs, "Expect:");
    if (req.method != "PUT") curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  } else if (req.method == "POST" || req.method == "PUT") {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, req.body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    if (req.method == "PUT") curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
    hdrs = curl_slist_append(hdrs, "Expect:");
  } else if (req.method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (req.method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }
  if (req.on_upload_progress) {
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_xfer);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  CURLcode rc = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp.status);
  if (t.body_file) std::fclose(t.body_file);
  curl_slist_free_all(hdrs);
  resp.transfer_ok = rc == CURLE_OK;
  if (rc != CURLE_OK) resp.error = t.sink_failed ? "the download could not be written" : curl_easy_strerror(rc);
  return resp;
}

void HttpClient::backoff(int attempt, const std::string& what, const HttpResponse& r) const {
  double d = retry_.first_delay_s;
  for (int i = 0; i < attempt; ++i) d = std::min(d * 2, 8.0);
  std::string why = r.status ? fmt::format("HTTP {}", r.status) : r.error;
  if (r.status && !r.transfer_ok && !r.error.empty()) why += ", " + r.error;
  std::fprintf(stderr, "[hub] %s: %s; retrying in %.1f s (%d/%d)\n", what.c_str(), why.c_str(), d, attempt + 1,
               retry_.max_retries);
  std::this_thread::sleep_for(std::chrono::duration<double>(d));
}

HttpResponse HttpClient::send(const HttpRequest& req) {
  for (int attempt = 0;; ++attempt) {
    HttpResponse r = send_once(req);
    if (!retryable(r) || attempt >= retry_.max_retries) return r;
    backoff(attempt, req.method + " " + req.url, r);
  }
}

std::string url_escape(const std::string& s) {
  char* e = curl_easy_escape(nullptr, s.data(), static_cast<int>(s.size()));
  std::string out = e ? e : "";
  curl_free(e);
  return out;
}

std::string url_escape_path(const std::string& path) {
  std::string out;
  size_t start = 0;
  while (true) {
    size_t slash = path.find('/', start);
    out += url_escape(path.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
    if (slash == std::string::npos) break;
    out += '/';
    start = slash + 1;
  }
  return out;
}

}  // namespace kiln::hub
