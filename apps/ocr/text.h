#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

// The text side of recognition, free of libtorch: the character dictionary,
// label encoding, CTC greedy decoding, edit distance and PaddleOCR's metrics,
// and the PaddleOCR recognition list format. Pure functions; thread-safe.
namespace dtrain::apps::ocr {

// The characters of a UTF-8 string (each one code point, as its bytes).
// InvalidUsage on malformed UTF-8.
std::vector<std::string> utf8_chars(const std::string& s);

// A character dictionary as PaddleOCR reads one: one character per line
// (UTF-8; a trailing '\r' is dropped), ids 1..N in file order; id 0 is CTC's
// blank. use_space_char appends " " (PaddleOCR's use_space_char).
class CharDict {
 public:
  // Errors name the file and line: an empty line, a line of more than one
  // character, a character listed twice; a missing or empty file.
  static CharDict load(const std::string& path, bool use_space_char);
  // From characters in id order; the same checks, `where` names the source.
  static CharDict from_chars(const std::vector<std::string>& chars, const std::string& where);

  size_t size() const { return chars_.size(); }  // characters, blank not counted
  int64_t num_classes() const { return int64_t(chars_.size()) + 1; }
  bool contains(const std::string& ch) const { return ids_.count(ch) > 0; }
  // The ids of text's characters. False when one is not in the dictionary;
  // then *bad (if given) is the first such character.
  bool encode(const std::string& text, std::vector<int64_t>* ids, std::string* bad = nullptr) const;
  // The text of ids (0 and ids out of range are skipped).
  std::string decode(const std::vector<int64_t>& ids) const;
  const std::vector<std::string>& chars() const { return chars_; }

 private:
  std::vector<std::string> chars_;
  std::unordered_map<std::string, int64_t> ids_;
};

// CTC greedy decoding of one sequence of per-step best classes: repeats
// collapsed, then blanks (0) dropped.
std::vector<int64_t> ctc_greedy(const int64_t* best, int64_t steps);

// Levenshtein distance between two strings, counted in characters (code points).
size_t edit_distance(const std::string& a, const std::string& b);

// PaddleOCR's RecMetric: acc = exact matches / samples, norm_edit_dis =
// 1 - mean(edit_distance / max(len(pred), len(label))) (0 for two empty
// strings). ignore_space removes spaces from both first (PaddleOCR's default);
// filter keeps only letters and digits, lower-cased (PaddleOCR's is_filter).
struct TextMetric {
  bool ignore_space = true, filter = false;
  double correct = 0, distance = 0, count = 0;  // distance: sum of normalised distances
  // Adds one sample; returns whether it matched.
  bool add(std::string pred, std::string label);
  double acc() const { return count > 0 ? correct / count : 0; }
  double norm_edit_dis() const { return count > 0 ? 1 - distance / count : 0; }
};

// One line of a PaddleOCR recognition list: "image_path<TAB>label".
struct ListEntry {
  std::string path;   // resolved against the root
  std::string label;  // as written
  std::vector<int64_t> ids;
  int line = 0;
};

struct ListFile {
  std::vector<ListEntry> entries;
  size_t skipped_unknown = 0, skipped_long = 0;  // lines skipped under skip_bad
};

// Reads a recognition list: "path\tlabel" per line (the first tab splits;
// blank lines are skipped; a path not absolute is relative to root). A label
// with a character outside the dictionary, or longer than max_length
// characters, is an error naming file and line and the character, or, with
// skip_bad, skipped and counted. A line without a tab, an empty label and a
// missing image are always errors naming file and line. limit > 0 keeps the
// first `limit` entries.
ListFile read_rec_list(const std::string& list_file, const std::string& root, const CharDict& dict, size_t max_length,
                       bool skip_bad, size_t limit = 0);

}  // namespace dtrain::apps::ocr
