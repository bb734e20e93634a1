// JSON Schema -> Grammar. The output is compact JSON by default (no whitespace between tokens, as
// nlohmann::json::dump() and OpenAI's structured outputs write it; SchemaOptions::whitespace allows
// any), properties in the schema's order; number exponents have at most two digits (every number
// is finite as a double).
//
// Enforced: type (object, array, string, number, integer, boolean, null, and lists of them), properties,
// required, additionalProperties (true / false / a schema; absent = options.additional_properties),
// enum, const, anyOf, oneOf (read as anyOf: exclusivity is not checked), allOf (merged: properties,
// required, bounds, types), $ref into the document (#, #/$defs/..., #/definitions/..., any JSON pointer;
// recursion allowed), items, prefixItems, items-as-array with additionalItems, minItems/maxItems,
// minLength/maxLength, pattern (regex.h's subset, JSON Schema's unanchored semantics), minimum /
// maximum / exclusive bounds of integers, minimum 0 of numbers, format date, time, date-time, uuid,
// email, OpenAPI's nullable. Annotations (title, description, default, examples, ...) and unknown
// keywords are no constraints and are skipped. A known constraint kiln cannot enforce (not, if/then/else,
// patternProperties, uniqueItems, multipleOf, other formats, ...) is an error naming it and its place
// under options.strict, and a warning otherwise (the grammar is then looser than the schema).
#pragma once
#include <string>
#include <vector>

#include "kiln/base/json.h"
#include "kiln/grammar/grammar.h"

namespace kiln::grammar {

struct SchemaOptions {
  bool strict = false;
  // Whether an object without "additionalProperties" may hold other properties (JSON Schema: yes).
  bool additional_properties = true;
  // Whitespace between JSON tokens: none (false: compact, like dump() and OpenAI's outputs) or any
  // (true: also pretty-printed JSON; unbounded, so a model may pad; opt-in).
  bool whitespace = false;
};

struct SchemaGrammar {
  Grammar grammar;
  std::vector<std::string> warnings;  // "keyword 'not' at #/properties/x is not enforced", ...
};

// Throws kiln::Error "[grammar] json schema: ..." for a malformed schema, an unresolvable $ref, or
// (strict) an unenforceable keyword.
SchemaGrammar json_schema_grammar(const OrderedJson& schema, const SchemaOptions& options = {});
SchemaGrammar json_schema_grammar(const std::string& schema_text, const SchemaOptions& options = {});
// response_format {"type": "json_object"}: any JSON object.
Grammar json_object_grammar(const SchemaOptions& options = {});

}  // namespace kiln::grammar
