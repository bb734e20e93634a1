// Error messages and JSON calls against the Hub.
#include "kiln/hub/api.h"

#include "kiln/base/error.h"

namespace kiln::hub {
namespace {

std::string hub_message(const HttpResponse& r) {
  std::string m = r.header("x-error-message");
  if (m.empty()) {
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (j.is_object() && j.contains("error") && j["error"].is_string()) m = j["error"].get<std::string>();
  }
  if (m.empty() && r.body.size() < 300) m = r.body;
  return m.empty() ? std::string() : " (the Hub says: " + m + ")";
}

}  // namespace

std::vector<std::string> hub_headers(const HubConfig& cfg) {
  std::vector<std::string> h;
  if (!cfg.token.empty()) h.push_back(cfg.auth_header());
  return h;
}

void raise_for_status(const HttpResponse& r, const std::string& what, const HubConfig& cfg) {
  if (r.ok()) return;
  const std::string code = r.header("x-error-code");
  const std::string said = hub_message(r);
  const std::string tok = cfg.token.empty() ? "no token was sent: pass --token, set HF_TOKEN or run `huggingface-cli login`"
                                            : "the token from " + cfg.token_source + " was sent";
  if (r.status == 0)
    fail("hub", "{}: cannot reach {} ({}); check the connection or HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use the cache",
         what, cfg.endpoint, r.error);
  if (!r.transfer_ok) fail("hub", "{}: the transfer broke off (HTTP {}, {})", what, r.status, r.error);
  if (r.status == 401)
    fail("hub", "{}: 401 unauthorized: the Hub refused the credentials; {}{}", what, tok, said);
  if (r.status == 403 || code == "GatedRepo")
    fail("hub", "{}: 403 forbidden: the repo is gated or private, or the token lacks the permission ({}); request "
         "access on the repo's page or use a token with access{}", what, tok, said);
  if (r.status == 404) {
    if (code == "RevisionNotFound") fail("hub", "{}: revision not found{}", what, said);
    if (code == "EntryNotFound") fail("hub", "{}: file not found in the repo{}", what, said);
    fail("hub", "{}: 404 not found: no such repo, or it is private and {}{}", what,
         cfg.token.empty() ? "no token was sent (pass --token or set HF_TOKEN)" : "the token has no access to it", said);
  }
  fail("hub", "{}: HTTP {} from {}{}", what, r.status, cfg.endpoint, said);
}

nlohmann::json send_json(HttpClient& http, HttpRequest req, const std::string& what, const HubConfig& cfg) {
  for (auto& h : hub_headers(cfg)) req.headers.push_back(h);
  if (req.timeout_s == 0) req.timeout_s = 120;
  HttpResponse r = http.send(req);
  raise_for_status(r, what, cfg);
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded()) fail("hub", "{}: the Hub's answer is not JSON: {}", what, r.body.substr(0, 200));
  return j;
}

}  // namespace kiln::hub
