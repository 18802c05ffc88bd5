#include "ctr/gen.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "ctr/criteo.h"
#include "dtrain/error.h"
#include "dtrain/sdk/random.h"

namespace dtrain::apps::ctr {

namespace {

constexpr int kEmb = 4;
constexpr int kPairs = 6;
constexpr double kZipf = 1.1;
constexpr double kBias = -1.4;

using sdk::splitmix64;  // dtrain/sdk/random.h
double unit(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53; }
double hash_normal(uint64_t h) {
  return std::sqrt(-2.0 * std::log(unit(splitmix64(h)))) *
         std::cos(6.283185307179586 * unit(splitmix64(h ^ 0x5bd1e995ull)));
}
uint64_t key3(uint64_t seed, uint64_t a, uint64_t b) {
  return splitmix64(splitmix64(splitmix64(seed) ^ a) ^ (b * sdk::kSplitMix64Gamma));
}

// A counter-based stream: draw i of a line is a pure function of (seed, line, i).
struct Stream {
  uint64_t base;
  uint64_t n = 0;
  double uniform() { return unit(splitmix64(base + 0x632be59bd9b4e019ull * ++n)); }
  double normal() {
    const double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

int64_t vocab_of(int slot) {
  static const int64_t sizes[] = {4, 12, 40, 100, 300, 1000, 3000, 10000, 30000, 100000};
  return sizes[(slot * 7) % 10];
}

struct Teacher {
  uint64_t seed;
  std::vector<std::vector<double>> cdf;  // per slot, over ranks
  double dense_coef[kDense];
  double dense_mean[kDense];
  int pair_a[kPairs], pair_b[kPairs];

  explicit Teacher(uint64_t s) : seed(s) {
    cdf.resize(kSparse);
    for (int slot = 0; slot < kSparse; ++slot) {
      const int64_t v = vocab_of(slot);
      auto& c = cdf[slot];
      c.resize(static_cast<size_t>(v));
      double acc = 0;
      for (int64_t r = 0; r < v; ++r) c[r] = (acc += std::pow(static_cast<double>(r + 1), -kZipf));
      for (auto& x : c) x /= acc;
    }
    for (int j = 0; j < kDense; ++j) {
      dense_coef[j] = 0.35 * hash_normal(key3(seed, 1000 + j, 0));
      dense_mean[j] = 0.5 + (j % 5);
    }
    for (int p = 0; p < kPairs; ++p) {
      pair_a[p] = p;
      pair_b[p] = p + 13;
    }
  }
  int64_t draw_rank(int slot, double u) const {
    const auto& c = cdf[slot];
    return std::min<int64_t>(static_cast<int64_t>(std::lower_bound(c.begin(), c.end(), u) - c.begin()),
                             static_cast<int64_t>(c.size()) - 1);
  }
  double shrink(int64_t rank) const { return 1.0 / std::sqrt(1.0 + static_cast<double>(rank) / 20.0); }
  double wide(int slot, int64_t rank) const { return 0.45 * shrink(rank) * hash_normal(key3(seed, slot, rank)); }
  double emb(int slot, int64_t rank, int k) const {
    return 0.7 * shrink(rank) * hash_normal(key3(seed ^ 0xabcdefull, slot * 16 + k, rank));
  }
  uint32_t token(int slot, int64_t rank) const { return static_cast<uint32_t>(key3(seed ^ 0x77ull, slot, rank)); }
};

struct Line {
  std::string text;
  double p = 0;
  float label = 0;
};

Line make_line(const Teacher& t, uint64_t seed, uint64_t index) {
  Stream st{splitmix64(seed * 0x2545f4914f6cdd1dull + index)};
  double logit = kBias;
  std::string dense_text[kDense];
  for (int j = 0; j < kDense; ++j) {
    const bool empty = st.uniform() < 0.1;
    const double g = st.normal();
    if (empty) continue;
    const long long count = std::max<long long>(0, static_cast<long long>(std::exp(t.dense_mean[j] + g)) - 1);
    dense_text[j] = std::to_string(count);
    logit += t.dense_coef[j] * (std::log1p(static_cast<double>(count)) - t.dense_mean[j]);
  }
  int64_t ranks[kSparse];
  bool missing[kSparse];
  for (int s = 0; s < kSparse; ++s) {
    missing[s] = (s % 4 == 3) && st.uniform() < 0.1;
    ranks[s] = t.draw_rank(s, st.uniform());
    if (!missing[s]) logit += t.wide(s, ranks[s]);
  }
  for (int p = 0; p < kPairs; ++p) {
    const int a = t.pair_a[p], b = t.pair_b[p];
    if (missing[a] || missing[b]) continue;
    double dot = 0;
    for (int k = 0; k < kEmb; ++k) dot += t.emb(a, ranks[a], k) * t.emb(b, ranks[b], k);
    logit += dot;
  }
  Line out;
  out.p = 1.0 / (1.0 + std::exp(-logit));
  out.label = st.uniform() < out.p ? 1.0f : 0.0f;
  out.text = out.label > 0 ? "1" : "0";
  for (int j = 0; j < kDense; ++j) out.text += "\t" + dense_text[j];
  char hex[16];
  for (int s = 0; s < kSparse; ++s) {
    out.text += "\t";
    if (missing[s]) continue;
    std::snprintf(hex, sizeof hex, "%08x", t.token(s, ranks[s]));
    out.text += hex;
  }
  return out;
}

void write_atomically(const std::string& path, const std::string& tmp, int64_t lines, const Teacher& t, uint64_t seed,
                      uint64_t first, int64_t bad_every, std::vector<float>* probs, std::vector<float>* labels) {
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw InvalidUsage("cannot write '" + tmp + "': " + std::strerror(errno));
    for (int64_t i = 0; i < lines; ++i) {
      if (bad_every > 0 && i % bad_every == bad_every / 2) {
        // Alternately a line with 3 fields and a full line whose I3 is not an integer.
        if ((i / bad_every) % 2 == 0) {
          out << "0\tx1\t3\n";
        } else {
          std::string text = make_line(t, seed, first + static_cast<uint64_t>(i)).text;
          size_t at = 0;
          for (int f = 0; f < 3; ++f) at = text.find('\t', at) + 1;  // the start of I3
          out << text.substr(0, at) << "x1" << text.substr(text.find('\t', at)) << '\n';
        }
        continue;
      }
      Line l = make_line(t, seed, first + static_cast<uint64_t>(i));
      out << l.text << '\n';
      if (probs) {
        probs->push_back(static_cast<float>(l.p));
        labels->push_back(l.label);
      }
    }
    out.flush();
    if (!out) throw InvalidUsage("write to '" + tmp + "' failed: " + std::strerror(errno));
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

double exact_auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  std::vector<size_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double pos = 0, neg = 0, rank_sum = 0;
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j < idx.size() && scores[idx[j]] == scores[idx[i]]) ++j;
    const double avg_rank = (static_cast<double>(i) + static_cast<double>(j - 1)) / 2.0 + 1.0;
    for (size_t k = i; k < j; ++k)
      if (labels[idx[k]] > 0.5f) rank_sum += avg_rank, ++pos;
    i = j;
  }
  neg = static_cast<double>(scores.size()) - pos;
  if (pos == 0 || neg == 0) return 0.5;
  return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg);
}

GenResult generate(const GenOptions& o) {
  if (o.dir.empty()) throw InvalidUsage("dtrain-ctr gen: no output folder (--dir)");
  if (o.train_lines <= 0 || o.test_lines <= 0) throw InvalidUsage("dtrain-ctr gen: line counts must be positive");
  std::filesystem::create_directories(o.dir);
  Teacher t(o.seed);
  const int64_t bad_every = o.bad_lines > 0 ? std::max<int64_t>(1, o.train_lines / o.bad_lines) : 0;
  write_atomically(o.dir + "/train.txt", o.dir + "/.train.txt.tmp", o.train_lines, t, o.seed, 0, bad_every, nullptr,
                   nullptr);
  std::vector<float> probs, labels;
  write_atomically(o.dir + "/test.txt", o.dir + "/.test.txt.tmp", o.test_lines, t, o.seed, 1ull << 40, 0, &probs,
                   &labels);
  GenResult r;
  r.teacher_auc = exact_auc(probs, labels);
  double ll = 0, clicks = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double p = std::clamp<double>(probs[i], 1e-7, 1 - 1e-7);
    ll -= labels[i] > 0.5f ? std::log(p) : std::log(1 - p);
    clicks += labels[i];
  }
  r.teacher_logloss = ll / static_cast<double>(probs.size());
  r.ctr = clicks / static_cast<double>(probs.size());
  const std::string tmp = o.dir + "/.teacher.toml.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "# written by dtrain-ctr gen: the teacher model's own figures on test.txt\n"
        << "seed = " << o.seed << "\ntrain_lines = " << o.train_lines << "\ntest_lines = " << o.test_lines
        << "\nteacher_auc = " << r.teacher_auc << "\nteacher_logloss = " << r.teacher_logloss << "\nctr = " << r.ctr
        << "\n";
  }
  std::filesystem::rename(tmp, o.dir + "/teacher.toml");
  return r;
}

}  // namespace dtrain::apps::ctr
