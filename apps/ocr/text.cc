#include "ocr/text.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"

namespace fs = std::filesystem;

namespace dtrain::apps::ocr {

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) throw InvalidUsage("malformed UTF-8 in '" + s + "'");
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) throw InvalidUsage("malformed UTF-8 in '" + s + "'");
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

CharDict CharDict::from_chars(const std::vector<std::string>& chars, const std::string& where) {
  CharDict d;
  for (size_t i = 0; i < chars.size(); ++i) {
    const std::string& ch = chars[i];
    std::string at = where + ":" + std::to_string(i + 1);
    if (ch.empty()) throw InvalidUsage(at + ": empty line in the character dictionary");
    std::vector<std::string> cps;
    try {
      cps = utf8_chars(ch);
    } catch (const InvalidUsage& e) {
      throw InvalidUsage(at + ": " + e.what());
    }
    if (cps.size() != 1)
      throw InvalidUsage(at + ": '" + ch + "' is not one character (a dictionary line holds exactly one)");
    if (d.ids_.count(ch)) throw InvalidUsage(at + ": character '" + ch + "' is listed twice");
    d.chars_.push_back(ch);
    d.ids_[ch] = int64_t(d.chars_.size());
  }
  if (d.chars_.empty()) throw InvalidUsage(where + ": the character dictionary is empty");
  return d;
}

CharDict CharDict::load(const std::string& path, bool use_space_char) {
  std::ifstream in(path);
  if (!in) throw IoError("cannot open character dictionary '" + path + "': " + std::strerror(errno));
  std::vector<std::string> chars;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    chars.push_back(line);
  }
  // A final empty line is the file's last newline seen twice by some editors: not a character.
  while (!chars.empty() && chars.back().empty() && chars.size() > 1) chars.pop_back();
  if (use_space_char && std::find(chars.begin(), chars.end(), " ") == chars.end()) chars.push_back(" ");
  return from_chars(chars, path);
}

bool CharDict::encode(const std::string& text, std::vector<int64_t>* ids, std::string* bad) const {
  ids->clear();
  for (const auto& ch : utf8_chars(text)) {
    auto it = ids_.find(ch);
    if (it == ids_.end()) {
      if (bad) *bad = ch;
      return false;
    }
    ids->push_back(it->second);
  }
  return true;
}

std::string CharDict::decode(const std::vector<int64_t>& ids) const {
  std::string s;
  for (int64_t id : ids)
    if (id >= 1 && id <= int64_t(chars_.size())) s += chars_[size_t(id - 1)];
  return s;
}

std::vector<int64_t> ctc_greedy(const int64_t* best, int64_t steps) {
  std::vector<int64_t> out;
  int64_t prev = -1;
  for (int64_t t = 0; t < steps; ++t) {
    if (best[t] != prev && best[t] != 0) out.push_back(best[t]);
    prev = best[t];
  }
  return out;
}

size_t edit_distance(const std::string& sa, const std::string& sb) {
  return sdk::levenshtein(utf8_chars(sa), utf8_chars(sb));
}

namespace {

std::string normalise(std::string s, bool ignore_space, bool filter) {
  if (ignore_space) s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
  if (filter) {
    std::string t;
    for (char c : s)
      if (std::isalnum(static_cast<unsigned char>(c))) t += char(std::tolower(static_cast<unsigned char>(c)));
    s = t;
  }
  return s;
}

}  // namespace

bool TextMetric::add(std::string pred, std::string label) {
  pred = normalise(std::move(pred), ignore_space, filter);
  label = normalise(std::move(label), ignore_space, filter);
  size_t longest = std::max(utf8_chars(pred).size(), utf8_chars(label).size());
  distance += longest == 0 ? 0.0 : double(edit_distance(pred, label)) / double(longest);
  count += 1;
  bool ok = pred == label;
  if (ok) correct += 1;
  return ok;
}

ListFile read_rec_list(const std::string& list_file, const std::string& root, const CharDict& dict, size_t max_length,
                       bool skip_bad, size_t limit) {
  std::ifstream in(list_file);
  if (!in) throw IoError("cannot open list file '" + list_file + "': " + std::strerror(errno));
  ListFile out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::string where = list_file + ":" + std::to_string(lineno);
    size_t tab = line.find('\t');
    if (tab == std::string::npos)
      throw InvalidUsage(where + ": expected 'image_path<TAB>label', got '" + line + "' (no tab)");
    ListEntry e;
    std::string rel = line.substr(0, tab);
    e.label = line.substr(tab + 1);
    e.line = lineno;
    if (rel.empty()) throw InvalidUsage(where + ": empty image path");
    if (e.label.empty()) throw InvalidUsage(where + ": empty label");
    std::string bad;
    bool known = false;
    try {
      known = dict.encode(e.label, &e.ids, &bad);
    } catch (const InvalidUsage& err) {
      throw InvalidUsage(where + ": " + err.what());
    }
    if (!known) {
      if (skip_bad) {
        ++out.skipped_unknown;
        continue;
      }
      throw InvalidUsage(where + ": label '" + e.label + "' has the character '" + bad +
                         "', which is not in the dictionary (data.unknown_chars = \"skip\" skips such lines)");
    }
    if (e.ids.size() > max_length) {
      if (skip_bad) {
        ++out.skipped_long;
        continue;
      }
      throw InvalidUsage(where + ": label '" + e.label + "' has " + std::to_string(e.ids.size()) +
                         " characters, more than data.max_text_length = " + std::to_string(max_length));
    }
    fs::path p = fs::path(rel).is_absolute() || root.empty() ? fs::path(rel) : fs::path(root) / rel;
    if (!fs::exists(p)) throw IoError(where + ": image '" + p.string() + "' does not exist");
    e.path = p.string();
    out.entries.push_back(std::move(e));
    if (limit > 0 && out.entries.size() >= limit) break;
  }
  if (out.entries.empty()) throw InvalidUsage("list file '" + list_file + "' has no usable entries");
  return out;
}

}  // namespace dtrain::apps::ocr
