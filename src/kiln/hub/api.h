// The Hub's answers read as huggingface_hub's hf_raise_for_status does: 401/403/404 (with the Hub's
// X-Error-Code: RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound) become one-line kiln::Errors
// that say what to do; anything else non-2xx quotes the Hub's own message.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "kiln/hub/config.h"
#include "kiln/hub/http.h"

namespace kiln::hub {

// Throws kiln::Error("[hub] ...") unless r.ok(). `what` names the request ("ORG/NAME", "file x").
void raise_for_status(const HttpResponse& r, const std::string& what, const HubConfig& cfg);

// The standard headers of a Hub API call (Authorization when a token is known).
std::vector<std::string> hub_headers(const HubConfig& cfg);

// A request sent with retries, checked, and its body parsed as JSON.
nlohmann::json send_json(HttpClient& http, HttpRequest req, const std::string& what, const HubConfig& cfg);

}  // namespace kiln::hub
