// Python str semantics over UTF-8 for the Jinja interpreter: code-point indexing, isspace,
// case mapping (glibc's C.UTF-8 tables), strip/split/splitlines/replace/title as CPython does
// them, and the repr quoting of strings.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::jinja::pystr {

std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
size_t length(std::string_view s);  // code points

bool is_space(char32_t c);  // str.isspace (also Python re's \s)
bool is_alpha(char32_t c);
bool is_digit(char32_t c);
bool is_alnum(char32_t c);
bool is_upper(char32_t c);
bool is_lower(char32_t c);
bool is_printable(char32_t c);  // str.isprintable, which decides repr's escapes

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title
std::string capitalize(std::string_view s);  // str.capitalize
std::string swapcase(std::string_view s);
// str.isupper (upper) or str.islower: some cased character, none of the other case.
bool all_cased(std::string_view s, bool upper);

// str.strip/lstrip/rstrip; chars null: whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split / str.rsplit; sep null: runs of whitespace. maxsplit < 0: no limit.
std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
// str.replace; count < 0: all. An empty old inserts new between code points.
std::string replace(std::string_view s, std::string_view old_s, std::string_view new_s, int64_t count);
int64_t count(std::string_view s, std::string_view sub);
// str.find in code points, -1 when absent.
int64_t find(std::string_view s, std::string_view sub, bool reverse);
// str.center/ljust/rjust with a one-code-point fill.
std::string pad(std::string_view s, int64_t width, char32_t fill, char align);

// Python repr of a str: quotes chosen like CPython, escapes for \n \t \\ and non-printables.
std::string repr(std::string_view s);
// markupsafe.escape: & < > " ' as entities.
std::string html_escape(std::string_view s);
// Number of \w+ runs (jinja2's wordcount).
int64_t word_count(std::string_view s);

// Python-style slice of n elements: fills the chosen indices (start/stop/step may be absent).
std::vector<int64_t> slice_indices(int64_t n, std::optional<int64_t> start, std::optional<int64_t> stop,
                                   std::optional<int64_t> step);

}  // namespace kiln::jinja::pystr
