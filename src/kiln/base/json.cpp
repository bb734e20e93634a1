// JSON parsing with one-line errors.
#include "kiln/base/json.h"

#include "kiln/base/mapped_file.h"

namespace kiln {
namespace {

template <typename J>
J parse(const std::string& text, const std::string& where, const std::string& component) {
  try {
    return J::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    auto p = what.find("parse error");
    fail(component, "{}: invalid JSON: {}", where, p == std::string::npos ? what : what.substr(p));
  }
}

}  // namespace

Json parse_json(const std::string& text, const std::string& where, const std::string& component) {
  return parse<Json>(text, where, component);
}

OrderedJson parse_ordered_json(const std::string& text, const std::string& where, const std::string& component) {
  return parse<OrderedJson>(text, where, component);
}

Json read_json_file(const std::string& path, const std::string& component) {
  return parse_json(read_file(path, component), path, component);
}

}  // namespace kiln
