#pragma once
// String helpers shared by the core, the SDK, the plugins, the launcher and
// the tools. Header-only, standard C++17, no dependencies; the one copy of each.

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::sdk {

// Leading and trailing blanks (space, tab, CR, LF) removed.
inline std::string trim(std::string_view s) {
  const char* blanks = " \t\r\n";
  size_t b = s.find_first_not_of(blanks);
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(blanks);
  return std::string(s.substr(b, e - b + 1));
}

// Splits on sep. With skip_empty, empty pieces ("a,,b", a trailing ",") are
// dropped; without, "a,,b" gives three pieces and "" gives one empty piece.
inline std::vector<std::string> split(std::string_view s, char sep = ',', bool skip_empty = true) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t end = s.find(sep, start);
    std::string_view piece = s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    if (!skip_empty || !piece.empty()) out.emplace_back(piece);
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

template <class Range>
std::string join(const Range& items, std::string_view sep = ",") {
  std::string out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out += sep;
    out += item;
    first = false;
  }
  return out;
}

inline std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Levenshtein distance: the fewest insertions, deletions and substitutions of
// one element that turn a into b. Any sequence with size() and operator[]:
// the bytes of a std::string, or code points, tokens, ... (O(|b|) memory).
template <class Seq>
size_t levenshtein(const Seq& a, const Seq& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace dtrain::sdk
