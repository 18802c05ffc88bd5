// The table engine's sparse rows over their life: admission (by count, by
// probability) and eviction by shrink (decay and score, unseen days).

#include "ps_table_util.h"

namespace dtrain::ps_grpc {
namespace {

using namespace table_test;  // NOLINT(build/namespaces)

TEST(Admission, ByCountCreatesTheRowAtTheNthPush) {
  TableDesc d = sparse_desc(DT_PS_OPT_SGD, DT_PS_MODE_ASYNC, 2);
  d.admit_count = 3;
  Cluster c(d, 1, 1);
  const std::vector<float> g = {1, 1};
  const float w0 = ref_init(d, 42, 0);
  c.push(0, {42}, g);
  c.push(0, {42, 42}, {1, 1, 1, 1});  // one push, however many times the key repeats in it
  EXPECT_EQ(c.rows(), 0u);
  EXPECT_EQ(c.servers[0]->stats().pending, 1u);
  EXPECT_EQ(c.pull(0, {42})[0], w0) << "counted, not applied";
  c.push(0, {42}, g);
  EXPECT_EQ(c.rows(), 1u);
  EXPECT_EQ(c.servers[0]->stats().pending, 0u);
  EXPECT_EQ(c.pull(0, {42})[0], w0 - 0.05f * 1.0f) << "the admitting push is applied";
}

TEST(Admission, ByProbabilityDecidedByAHashOfSeedAndKey) {
  TableDesc d = sparse_desc(DT_PS_OPT_SGD, DT_PS_MODE_ASYNC, 1);
  d.admit_probability = 0.3;
  std::vector<uint64_t> keys(4000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 104729;
  const std::vector<float> g(keys.size(), 1.0f);
  Cluster a(d, 1, 1), b(d, 3, 1, 9);
  a.push(0, keys, g);
  b.push(0, keys, g);
  const auto va = a.pull(0, keys), vb = b.pull(0, keys);
  EXPECT_EQ(va, vb) << "the same keys admitted on any server count";
  size_t admitted = 0;
  for (size_t i = 0; i < keys.size(); ++i) admitted += va[i] != ref_init(d, keys[i], 0);
  EXPECT_EQ(admitted, a.rows());
  EXPECT_NEAR(static_cast<double>(admitted) / keys.size(), 0.3, 0.03);
  d.admit_probability = 0.0;
  Cluster none(d, 1, 1);
  none.push(0, keys, g);
  EXPECT_EQ(none.rows(), 0u);
  EXPECT_EQ(none.servers[0]->stats().pending, 0u) << "a refused key is not even counted";
}

TEST(Shrink, DecaysThenDeletesByScore) {
  TableDesc d = sparse_desc(DT_PS_OPT_SGD, DT_PS_MODE_ASYNC, 2);
  d.decay_rate = 0.5;
  d.nonclk_coeff = 0.1;
  d.click_coeff = 1.0;
  d.delete_threshold = 0.6;
  Cluster c(d, 2, 1, 8);
  // show, click: key 1 (10, 0) -> 5,0 -> score 0.5 deleted; key 2 (10, 2) -> 5,1 -> 0.4 + 1 kept;
  // key 3 (20, 0) -> 10,0 -> 1.0 kept; key 4 (1, 1) -> 0.5, 0.5 -> 0.5 deleted.
  const std::vector<float> sc = {10, 0, 10, 2, 20, 0, 1, 1};
  c.push(0, {1, 2, 3, 4}, std::vector<float>(8, 0.0f), &sc);
  EXPECT_EQ(c.shrink(0), 2u);
  EXPECT_EQ(c.rows(), 2u);
  std::set<uint64_t> left;
  for (const auto& l : dump(c)) left.insert(std::stoull(l.substr(0, l.find(' '))));
  EXPECT_EQ(left, (std::set<uint64_t>{2, 3}));
  // Second shrink: key 2 -> 2.5, 0.5 -> 0.2 + 0.5 = 0.7 kept; key 3 -> 5 -> 0.5 deleted.
  EXPECT_EQ(c.shrink(0), 1u);
  EXPECT_EQ(c.rows(), 1u);
}

TEST(Shrink, DeletesRowsUnseenForMoreThanTheDays) {
  TableDesc d = sparse_desc(DT_PS_OPT_ADAM, DT_PS_MODE_ASYNC, 3);
  d.delete_after_unseen_days = 2;
  d.delete_threshold = -1;  // never by score
  Cluster c(d, 2, 1, 16);
  std::vector<uint64_t> old_keys, new_keys;
  for (uint64_t k = 0; k < 300; ++k) (k % 3 ? old_keys : new_keys).push_back(k);
  c.push(0, old_keys, std::vector<float>(old_keys.size() * 3, 0.5f));
  c.push(0, new_keys, std::vector<float>(new_keys.size() * 3, 0.5f));
  EXPECT_EQ(c.shrink(DT_PS_SHRINK_NEW_DAY), 0u);                       // day 1
  EXPECT_EQ(c.shrink(DT_PS_SHRINK_NEW_DAY), 0u);                       // day 2: unseen 2, not more than 2
  c.push(0, new_keys, std::vector<float>(new_keys.size() * 3, 0.5f));  // resets their age
  const auto before = c.pull(0, new_keys);
  EXPECT_EQ(c.shrink(DT_PS_SHRINK_NEW_DAY), old_keys.size());
  EXPECT_EQ(c.rows(), new_keys.size());
  EXPECT_EQ(c.pull(0, new_keys), before) << "rows moved inside the arena keep their values";
  EXPECT_EQ(c.pull(0, old_keys), Cluster(d, 1, 1).pull(0, old_keys)) << "deleted rows pull as initial";
}

// ---- save and load ----

}  // namespace
}  // namespace dtrain::ps_grpc
