#include "ctr/criteo.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include "dtrain/error.h"
#include "dtrain/sdk/random.h"

namespace dtrain::apps::ctr {

namespace {

using sdk::splitmix64;  // dtrain/sdk/random.h

uint64_t fnv1a(const char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
  return h;
}

bool parse_int(const char* p, size_t n, long long* out) {
  if (n == 0 || n > 20) return false;
  char buf[24];
  std::memcpy(buf, p, n);
  buf[n] = 0;
  char* end = nullptr;
  *out = std::strtoll(buf, &end, 10);
  return end == buf + n;
}

bool parse_double(const char* p, size_t n, double* out) {
  if (n == 0 || n > 40) return false;
  char buf[48];
  std::memcpy(buf, p, n);
  buf[n] = 0;
  char* end = nullptr;
  *out = std::strtod(buf, &end);
  return end == buf + n && std::isfinite(*out);
}

std::string quote(const char* p, size_t n) { return "'" + std::string(p, std::min<size_t>(n, 32)) + "'"; }

bool parse_criteo(const char* line, size_t len, Example* out, std::string* why) {
  const char* fields[40];
  size_t lens[40];
  size_t nf = 0;
  const char* start = line;
  for (size_t i = 0; i <= len; ++i) {
    if (i == len || line[i] == '\t') {
      if (nf < 40) {
        fields[nf] = start;
        lens[nf] = static_cast<size_t>(line + i - start);
      }
      ++nf;
      start = line + i + 1;
    }
  }
  if (nf != 40) {
    *why = "has " + std::to_string(nf) + " tab-separated fields, expected 40 (label, I1..I13, C1..C26)";
    return false;
  }
  long long v = 0;
  if (!parse_int(fields[0], lens[0], &v) || (v != 0 && v != 1)) {
    *why = "label is " + quote(fields[0], lens[0]) + " (expected 0 or 1)";
    return false;
  }
  out->label = static_cast<float>(v);
  for (int j = 0; j < kDense; ++j) {
    const size_t n = lens[1 + j];
    if (n == 0) {
      out->dense[j] = 0.0f;
      continue;
    }
    if (!parse_int(fields[1 + j], n, &v)) {
      *why = "I" + std::to_string(j + 1) + " is " + quote(fields[1 + j], n) + " (not an integer)";
      return false;
    }
    out->dense[j] = scale_count(static_cast<double>(v));
  }
  for (int s = 0; s < kSparse; ++s) out->sparse[s] = feature_sign(s, fields[14 + s], lens[14 + s]);
  return true;
}

bool parse_slot(const char* line, size_t len, Example* out, std::string* why) {
  bool have_label = false;
  bool have_slot[kSparse] = {};
  int ndense = 0;
  size_t i = 0;
  while (i < len) {
    while (i < len && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t b = i;
    while (i < len && line[i] != ' ' && line[i] != '\t') ++i;
    if (b == i) break;
    const char* tok = line + b;
    const size_t n = i - b;
    const char* colon = static_cast<const char*>(std::memchr(tok, ':', n));
    if (!colon) {
      *why = "token " + quote(tok, n) + " has no ':'";
      return false;
    }
    const size_t kn = static_cast<size_t>(colon - tok);
    const char* val = colon + 1;
    const size_t vn = n - kn - 1;
    std::string key(tok, kn);
    if (key == "click") {
      long long v = 0;
      if (!parse_int(val, vn, &v) || (v != 0 && v != 1)) {
        *why = "click is " + quote(val, vn) + " (expected 0 or 1)";
        return false;
      }
      out->label = static_cast<float>(v);
      have_label = true;
    } else if (key == "dense_feature") {
      double d = 0;
      if (!parse_double(val, vn, &d)) {
        *why = "dense_feature #" + std::to_string(ndense + 1) + " is " + quote(val, vn) + " (not a number)";
        return false;
      }
      if (ndense < kDense) out->dense[ndense] = static_cast<float>(d);
      ++ndense;
    } else {
      long long slot = 0;
      if (!parse_int(tok, kn, &slot) || slot < 1 || slot > kSparse) {
        *why =
            "unknown slot " + quote(tok, kn) + " (expected click, dense_feature or 1.." + std::to_string(kSparse) + ")";
        return false;
      }
      if (!have_slot[slot - 1]) {
        out->sparse[slot - 1] = feature_sign(static_cast<int>(slot - 1), val, vn);
        have_slot[slot - 1] = true;
      }
    }
  }
  if (!have_label) {
    *why = "has no click:<label>";
    return false;
  }
  if (ndense != kDense) {
    *why = "has " + std::to_string(ndense) + " dense_feature values, expected " + std::to_string(kDense);
    return false;
  }
  for (int s = 0; s < kSparse; ++s)
    if (!have_slot[s]) out->sparse[s] = feature_sign(s, "", 0);
  return true;
}

}  // namespace

Format parse_format(const std::string& name) {
  if (name == "criteo") return Format::Criteo;
  if (name == "slot") return Format::Slot;
  throw InvalidUsage("unknown data format '" + name + "' (known: criteo, slot)");
}

uint64_t feature_sign(int slot, const char* token, size_t len) {
  return splitmix64(fnv1a(token, len) ^ (static_cast<uint64_t>(slot + 1) * sdk::kSplitMix64Gamma));
}

float scale_count(double x) { return static_cast<float>(std::log1p(x > 0 ? x : 0.0)); }

bool parse_line(Format format, const char* line, size_t len, Example* out, std::string* why) {
  while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) --len;
  return format == Format::Criteo ? parse_criteo(line, len, out, why) : parse_slot(line, len, out, why);
}

int64_t count_lines(const std::vector<std::string>& files, int64_t limit) {
  int64_t n = 0;
  std::string line;
  for (const auto& f : files) {
    std::ifstream in(f);
    if (!in) throw InvalidUsage("cannot open data file '" + f + "': " + std::strerror(errno));
    while (std::getline(in, line)) {
      if (limit > 0 && n >= limit) return n;
      ++n;
    }
  }
  return n;
}

Reader::Reader(std::vector<std::string> files, ReaderOptions options) : files_(std::move(files)), o_(options) {
  if (files_.empty()) throw InvalidUsage("no data files given");
  for (const auto& f : files_) {
    std::ifstream in(f);
    if (!in) throw InvalidUsage("cannot open data file '" + f + "': " + std::strerror(errno));
  }
  prefetch_ = std::make_unique<Prefetcher<Batch>>(static_cast<size_t>(std::max(1, o_.prefetch)),
                                                  [this](const Prefetcher<Batch>::Push& push) { produce(push); });
}

Reader::~Reader() = default;

void Reader::produce(const Prefetcher<Batch>::Push& push) {
  // A batch is batch_size lines of this worker's share, malformed ones left
  // out, so every worker makes the same number of batches (sync mode).
  Batch batch;
  int64_t index = 0, kept = 0, batch_lines = 0;
  std::string line, why;
  Example ex;
  auto flush = [&](bool force) {
    if (batch_lines == 0 || (!force && batch_lines < o_.batch_size)) return true;
    batch_lines = 0;
    return push(std::exchange(batch, Batch{}));
  };
  for (const auto& f : files_) {
    std::ifstream in(f);
    if (!in) throw InvalidUsage("cannot open data file '" + f + "': " + std::strerror(errno));
    int64_t lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (o_.limit > 0 && index >= o_.limit) break;
      if (index++ % o_.world != o_.rank) continue;
      if (o_.per_worker > 0 && kept >= o_.per_worker) break;
      ++kept;
      ++batch_lines;
      if (parse_line(o_.format, line.data(), line.size(), &ex, &why)) {
        batch.labels.push_back(ex.label);
        batch.dense.insert(batch.dense.end(), ex.dense, ex.dense + kDense);
        batch.keys.insert(batch.keys.end(), ex.sparse, ex.sparse + kSparse);
      } else {
        std::string msg = f + ":" + std::to_string(lineno) + ": " + why;
        if (o_.on_error == OnError::Fail)
          throw InvalidUsage(msg + " ([data] on_error = \"fail\"; set \"skip\" to skip and count such lines)");
        std::lock_guard<std::mutex> lk(mu_);
        if (skipped_++ == 0) first_error_ = msg;
      }
      if (!flush(false)) return;
    }
  }
  flush(true);
}

bool Reader::next(Batch* out) { return prefetch_->next(out); }

std::string Reader::first_error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return first_error_;
}

int64_t Reader::skipped() const {
  std::lock_guard<std::mutex> lk(mu_);
  return skipped_;
}

}  // namespace dtrain::apps::ctr
