// The table engine's save and load: FULL saves onto other server counts,
// BASE + DELTA, damaged saves (a truncated part, a missing MANIFEST) and an
// interrupted save that leaves the previous one loadable.

#include "ps_table_util.h"

namespace dtrain::ps_grpc {
namespace {

using namespace table_test;  // NOLINT(build/namespaces)

Cluster trained(const TableDesc& d, int servers, std::mt19937_64& rng, int steps = 5) {
  Cluster c(d, servers, 1, 16);
  for (int s = 0; s < steps; ++s) {
    if (d.kind == DT_PS_TABLE_DENSE) {
      c.push_dense(0, random_grads(rng, d.dim));
      continue;
    }
    std::vector<uint64_t> keys;
    for (int i = 0; i < 200; ++i) keys.push_back(rng() % 1000 * 0x100000001ull);
    std::vector<float> sc(keys.size() * 2);
    for (size_t i = 0; i < keys.size(); ++i) sc[2 * i] = float(i % 5), sc[2 * i + 1] = float(i % 2);
    c.push(0, keys, random_grads(rng, keys.size() * d.dim), &sc);
  }
  if (d.kind == DT_PS_TABLE_SPARSE) c.shrink(DT_PS_SHRINK_NEW_DAY);  // unseen_days 1 everywhere
  return c;
}

TEST(SaveLoad, FullSaveLoadsOntoOneTwoAndThreeServersExactly) {
  for (int format : {DT_PS_FORMAT_BINARY, DT_PS_FORMAT_TEXT})
    for (int opt : {DT_PS_OPT_SGD, DT_PS_OPT_ADAGRAD, DT_PS_OPT_ADAM})
      for (bool sparse : {true, false}) {
        SCOPED_TRACE(std::string(sparse ? "sparse " : "dense ") + std::to_string(opt) + " format " +
                     std::to_string(format));
        const TableDesc d = sparse ? sparse_desc(opt, DT_PS_MODE_ASYNC, 5) : dense_desc(opt, DT_PS_MODE_ASYNC, 23);
        std::mt19937_64 rng(11);
        Cluster src = trained(d, 2, rng);
        const std::string dir = temp_dir();
        src.save(dir, "g1", DT_PS_SAVE_FULL, format);
        const auto want = dump(src);
        ASSERT_FALSE(want.empty());
        for (int servers : {1, 2, 3}) {
          Cluster dst(d, servers, 1, servers == 2 ? 16 : 7);
          dst.load(dir);
          ASSERT_EQ(dump(dst), want) << servers << " servers";
          // The state is live: one more step gives the same values on both.
          std::mt19937_64 r2(99);
          if (sparse) {
            const std::vector<uint64_t> keys = {0, 0x100000001ull * 3, 0x100000001ull * 999};
            const auto g = random_grads(r2, keys.size() * d.dim);
            Cluster again(d, 2, 1, 16);
            again.load(dir);
            again.push(0, keys, g);
            dst.push(0, keys, g);
            ASSERT_EQ(dst.pull(0, keys), again.pull(0, keys));
          } else {
            const auto g = random_grads(r2, d.dim);
            Cluster again(d, 1, 1);
            again.load(dir);
            again.push_dense(0, g);
            dst.push_dense(0, g);
            ASSERT_EQ(dst.pull_dense(0), again.pull_dense(0));
          }
        }
      }
}

TEST(SaveLoad, BasePlusDeltaRestoresTheLatestValues) {
  for (int format : {DT_PS_FORMAT_BINARY, DT_PS_FORMAT_TEXT}) {
    const TableDesc d = sparse_desc(DT_PS_OPT_ADAGRAD, DT_PS_MODE_ASYNC, 4);
    std::mt19937_64 rng(5);
    Cluster src = trained(d, 2, rng);
    const std::string base = temp_dir(), delta = temp_dir();
    src.save(base, "b", DT_PS_SAVE_BASE, format);
    const std::vector<uint64_t> changed = {1ull << 40, 0x100000001ull * 7, 12345};
    src.push(0, changed, random_grads(rng, changed.size() * d.dim));
    src.save(delta, "d", DT_PS_SAVE_DELTA, format);
    const Manifest dm = Manifest::read(delta + "/emb");
    EXPECT_EQ(dm.mode, DT_PS_SAVE_DELTA);
    if (format == DT_PS_FORMAT_TEXT) {
      size_t lines = 0;
      for (const auto& f : dm.files) {
        std::ifstream in(delta + "/emb/" + f);
        for (std::string l; std::getline(in, l);) ++lines;
      }
      EXPECT_EQ(lines, changed.size()) << "a delta holds only the rows changed since the base";
    }
    std::vector<uint64_t> keys = changed;
    for (uint64_t k = 0; k < 1000; ++k) keys.push_back(k * 0x100000001ull);
    Cluster dst(d, 3, 1, 16);
    dst.load(base);
    dst.load(delta);
    EXPECT_EQ(dst.pull(0, keys), src.pull(0, keys));
    EXPECT_EQ(dst.rows(), src.rows());
    // A second delta with nothing changed is empty.
    const std::string empty = temp_dir();
    src.save(empty, "e", DT_PS_SAVE_DELTA, format);
    Cluster probe(d, 1, 1);
    probe.load(empty);
    EXPECT_EQ(probe.rows(), 0u);
  }
}

TEST(SaveLoad, TruncatedPartOrMissingManifestIsAClearErrorAndChangesNothing) {
  const TableDesc d = sparse_desc(DT_PS_OPT_ADAM, DT_PS_MODE_ASYNC, 4);
  std::mt19937_64 rng(8);
  Cluster src = trained(d, 2, rng);
  const std::string dir = temp_dir();
  src.save(dir, "g1", DT_PS_SAVE_FULL, DT_PS_FORMAT_BINARY);
  Cluster dst(d, 1, 1);
  dst.push(0, {3}, {1, 2, 3, 4});
  const auto before = dump(dst);
  const Manifest m = Manifest::read(dir + "/emb");
  const std::string part = dir + "/emb/" + m.files[1];
  struct stat st {};
  ASSERT_EQ(::stat(part.c_str(), &st), 0);
  ASSERT_EQ(::truncate(part.c_str(), st.st_size - 13), 0);
  std::string msg = expect_error([&] { dst.load(dir); }, DT_ERR_SYSTEM);
  EXPECT_NE(msg.find(part), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_EQ(dump(dst), before);

  ::unlink((dir + "/emb/MANIFEST").c_str());
  msg = expect_error([&] { dst.load(dir); }, DT_ERR_SYSTEM);
  EXPECT_NE(msg.find(dir + "/emb/MANIFEST does not exist"), std::string::npos) << msg;

  // A damaged manifest names its line; a dim mismatch names the field.
  {
    std::ofstream out(dir + "/emb/MANIFEST");
    out << "version = 1\ntable = emb\nkind = sparse\ndim = four\n";
  }
  msg = expect_error([&] { dst.load(dir); }, DT_ERR_SYSTEM);
  EXPECT_NE(msg.find("MANIFEST:4"), std::string::npos) << msg;
  const std::string ok = temp_dir();
  src.save(ok, "g2", DT_PS_SAVE_FULL, DT_PS_FORMAT_TEXT);
  TableDesc wide = d;
  wide.dim = 8;
  Cluster other(wide, 1, 1);
  msg = expect_error([&] { other.load(ok); }, DT_ERR_INVALID_USAGE);
  EXPECT_NE(msg.find("dim is 4"), std::string::npos) << msg;
  TableDesc sgd = d;
  sgd.optimizer = DT_PS_OPT_SGD;
  Cluster plain(sgd, 1, 1);
  msg = expect_error([&] { plain.load(ok); }, DT_ERR_INVALID_USAGE);
  EXPECT_NE(msg.find("optimizer is adam"), std::string::npos) << msg;
  // A text part with a short line names the file and the line.
  const Manifest tm = Manifest::read(ok + "/emb");
  { std::ofstream(ok + "/emb/" + tm.files[0], std::ios::app) << "17 0.5 0.25\n"; }
  msg = expect_error([&] { dst.load(ok); }, DT_ERR_SYSTEM);
  EXPECT_NE(msg.find(tm.files[0] + " line "), std::string::npos) << msg;
  EXPECT_NE(msg.find("found 3"), std::string::npos) << msg;
  EXPECT_EQ(dump(dst), before);
}

TEST(SaveLoad, AnInterruptedSaveLeavesThePreviousOneLoadable) {
  for (bool sparse : {true, false}) {
    const TableDesc d = sparse ? sparse_desc(DT_PS_OPT_ADAM, DT_PS_MODE_ASYNC, 4) : dense_desc(DT_PS_OPT_ADAM);
    std::mt19937_64 rng(9);
    Cluster src = trained(d, 2, rng);
    const std::string dir = temp_dir();
    src.save(dir, "g1", DT_PS_SAVE_FULL, DT_PS_FORMAT_BINARY);
    const auto first = dump(src);
    std::mt19937_64 more(10);
    Cluster changed = trained(d, 2, more, 3);
    changed.save(dir, "g2", DT_PS_SAVE_FULL, DT_PS_FORMAT_BINARY, /*manifest=*/false);  // killed before the manifest
    Cluster dst(d, 3, 1, 16);
    dst.load(dir);
    EXPECT_EQ(dump(dst), first);
    // The next complete save replaces it and removes the unlisted parts.
    changed.save(dir, "g3", DT_PS_SAVE_FULL, DT_PS_FORMAT_BINARY);
    size_t parts = 0;
    for (auto f : {"g1", "g2", "g3"})
      for (int s = 0; s < 2; ++s)
        parts +=
            ::access((dir + "/" + d.name + "/part-" + f + "-" + std::to_string(s) + "-of-2.bin").c_str(), F_OK) == 0;
    EXPECT_EQ(parts, 2u);
    Cluster dst2(d, 1, 1);
    dst2.load(dir);
    EXPECT_EQ(dump(dst2), dump(changed));
  }
}

// ---- bad input ----

}  // namespace
}  // namespace dtrain::ps_grpc
