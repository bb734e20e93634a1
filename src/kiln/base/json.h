// JSON (nlohmann) plus typed getters that turn a missing or mistyped key into a kiln::Error
// naming the file and the key. OrderedJson keeps keys in their order (request bodies, chat
// messages, template kwargs: what a chat template iterates sees the order the client sent).
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "kiln/base/error.h"

namespace kiln {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Parses text; on failure throws "[component] <where>: invalid JSON: <reason>".
Json parse_json(const std::string& text, const std::string& where, const std::string& component = "io");
OrderedJson parse_ordered_json(const std::string& text, const std::string& where, const std::string& component = "io");
Json read_json_file(const std::string& path, const std::string& component = "io");

// j[key] as T when present and not null, else nullopt; a value of the wrong type throws.
template <typename T>
std::optional<T> json_get(const Json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    fail("config", "{}: key \"{}\" has the wrong type ({})", where, key, it->type_name());
  }
}

// j[key] as T; a missing key throws "[config] <where>: missing key "<key>"".
template <typename T>
T json_require(const Json& j, const char* key, const std::string& where) {
  auto v = json_get<T>(j, key, where);
  if (!v) fail("config", "{}: missing key \"{}\"", where, key);
  return *v;
}

}  // namespace kiln
