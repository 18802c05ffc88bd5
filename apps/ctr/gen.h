#pragma once

#include <cstdint>
#include <string>
#include <vector>

// `dtrain-ctr gen`: Criteo-format click logs drawn from a known teacher model,
// so the best AUC any model can reach on them is known exactly.
//
// The teacher: slot s (26 of them) has a vocabulary of V_s values (4 to
// 100,000) drawn with power-law (Zipf, exponent 1.1) frequencies, as real
// logs are: a few values are very frequent, most are rare. The click
// probability is sigmoid(bias + sum_s w_s(v) + sum_j a_j * z_j +
// sum_pairs <e_s(v), e_t(u)>), with a wide weight per (slot, value) that
// shrinks with the value's rank, a 4-dimensional teacher embedding per (slot,
// value) whose dot products over 6 slot pairs only a deep model can learn,
// and 13 integer features (log-normal counts, 10% empty) entering through
// z_j = log1p(count) - mean. Everything is a pure function of the seed.
namespace dtrain::apps::ctr {

struct GenOptions {
  std::string dir;  // writes train.txt, test.txt, teacher.toml
  int64_t train_lines = 400000;
  int64_t test_lines = 50000;
  uint64_t seed = 1;
  int64_t bad_lines = 0;  // malformed lines sprinkled into train.txt (tests): 3 fields, or I3 not an integer
};

struct GenResult {
  double teacher_auc = 0;      // on test.txt, with the teacher's own probabilities
  double teacher_logloss = 0;  // idem
  double ctr = 0;              // clicks / lines in test.txt
};

// Writes the files (each through a temporary name, then renamed) and returns
// the teacher's figures, also written to <dir>/teacher.toml.
GenResult generate(const GenOptions& options);

// Exact AUC of scores against 0/1 labels (ties count one half).
double exact_auc(const std::vector<float>& scores, const std::vector<float>& labels);

}  // namespace dtrain::apps::ctr
