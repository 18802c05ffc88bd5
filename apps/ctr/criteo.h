#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/prefetch.h"

// Click logs for the CTR app: the Criteo text format and PaddleRec's slot
// format, parsed into feature signs (u64 keys of the sparse tables).
namespace dtrain::apps::ctr {

constexpr int kDense = 13;   // Criteo's integer features I1..I13
constexpr int kSparse = 26;  // Criteo's categorical features C1..C26

// One example: label, the 13 dense features after log1p scaling (an empty
// field is 0), and one feature sign per categorical slot (an empty field gets
// the slot's own "missing" sign).
struct Example {
  float label = 0;
  float dense[kDense] = {};
  uint64_t sparse[kSparse] = {};
};

enum class Format { Criteo, Slot };
Format parse_format(const std::string& name);  // "criteo" | "slot"; InvalidUsage otherwise

// The feature sign of a categorical value in a slot: a 64-bit hash of
// (slot, token); the same on every worker and in `dtrain-ctr predict`.
uint64_t feature_sign(int slot, const char* token, size_t len);
// log1p of a non-negative count; negative counts (Criteo has a few) clamp to 0.
float scale_count(double x);

// Parses one line. Criteo: `label \t I1..I13 \t C1..C26` (40 tab-separated
// fields, integers and 8-hex-digit hashes, any of I and C empty). Slot
// (PaddleRec): `click:L dense_feature:v x13 1:sign ... 26:sign`, space
// separated, a slot absent or listed several times taking its first sign.
// On a malformed line returns false and sets *why (e.g. "has 39 fields,
// expected 40", "I3 is 'x1' (not an integer)").
bool parse_line(Format format, const char* line, size_t len, Example* out, std::string* why);

// What to do with a malformed line ([data] on_error).
enum class OnError { Skip, Fail };

struct ReaderOptions {
  Format format = Format::Criteo;
  OnError on_error = OnError::Skip;
  int rank = 0, world = 1;  // worker w reads lines i with i % world == w (over all files, in order)
  int64_t batch_size = 512;
  int64_t limit = 0;  // consider only the first `limit` lines of the whole input (0: all)
  // Keep at most this many lines of this worker's share (0: all). Sync mode
  // needs every worker to run the same number of steps: the app passes the
  // smallest share, (lines / world).
  int64_t per_worker = 0;
  int prefetch = 8;  // batches parsed ahead by the background thread
};

// A batch in the layout the model wants.
struct Batch {
  std::vector<float> labels;   // n
  std::vector<float> dense;    // n x kDense
  std::vector<uint64_t> keys;  // n x kSparse, example-major
  size_t size() const { return labels.size(); }
};

// Reads files in order on a background thread, keeps this worker's share of
// the lines and hands out batches. A missing file is an error naming the path
// (thrown by the constructor); a malformed line names the file and line and
// is skipped and counted (OnError::Skip) or fatal (next() rethrows).
class Reader {
 public:
  Reader(std::vector<std::string> files, ReaderOptions options);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  // False at the end of the input. Rethrows a parsing error.
  bool next(Batch* out);
  int64_t skipped() const;          // malformed lines skipped so far (this worker's share)
  std::string first_error() const;  // "file:line: why" of the first skip
  double wait_seconds() const { return prefetch_->wait_seconds(); }

 private:
  void produce(const Prefetcher<Batch>::Push& push);
  std::vector<std::string> files_;
  ReaderOptions o_;
  mutable std::mutex mu_;  // skipped_, first_error_
  int64_t skipped_ = 0;
  std::string first_error_;
  std::unique_ptr<Prefetcher<Batch>> prefetch_;  // last: its thread uses the members above
};

// Counts the lines of files (for ETA and steps per epoch).
int64_t count_lines(const std::vector<std::string>& files, int64_t limit = 0);

}  // namespace dtrain::apps::ctr
