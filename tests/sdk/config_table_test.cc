// The SDK's ConfigTable (dtrain/sdk/config_table.h): a plugin's keys declared
// once, with their bounds. From the one declaration: the C array of the ABI
// (the bound shown in the description, the ABI's key struct having no field
// for it), and a read that fails naming the key, the value and the bound. Then
// the in-tree plugins as the core loads them: their tables show the bounds,
// and a value out of bounds fails at communicator creation (no silent raise).
#include "dtrain/sdk/config_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

struct Keys {
  std::string algorithm = "ring";
  int64_t chunk_bytes = 131072;
  int depth = 8;
  uint32_t shards = 64;
  double ratio = 0.5;
  bool verbose = false;
  int64_t bad_default = 1;  // outside its own bound: the plugin's bug
};

const dtrain::sdk::ConfigTable<Keys>& keys() {
  using dtrain::sdk::at_least;
  using dtrain::sdk::in_range;
  static const dtrain::sdk::ConfigTable<Keys> table(
      "mine", {
                  {"algorithm", &Keys::algorithm, "ring or \"tree\""},
                  {"chunk_bytes", &Keys::chunk_bytes, at_least(4096), "pipeline chunk"},
                  {"depth", &Keys::depth, in_range(1, 64), "chunks in flight"},
                  {"shards", &Keys::shards, at_least(1), "shards"},
                  {"ratio", &Keys::ratio, in_range(0, 1), "a fraction"},
                  {"verbose", &Keys::verbose, "log more"},
                  {"bad_default", &Keys::bad_default, at_least(2), "declared wrong"},
              });
  return table;
}

// The error of f, whose status must be want.
template <typename F>
std::string error_of(F&& f, dt_status_t want = DT_ERR_INVALID_USAGE) {
  try {
    f();
  } catch (const dtrain::sdk::Error& e) {
    EXPECT_EQ(e.status(), want) << e.what();
    return e.what();
  }
  return "(no error)";
}

// Options as the SDK's trampoline builds them: the text and the table's C array.
dtrain::sdk::Options options(const std::string& text) {
  return dtrain::sdk::Options(text.c_str(), keys().abi_keys(), keys().num_keys());
}

TEST(ConfigTable, MakesTheAbiKeysFromTheOneDeclaration) {
  ASSERT_EQ(keys().num_keys(), 7u);
  const dt_config_key_v1_t* k = keys().abi_keys();
  EXPECT_STREQ(k[0].name, "algorithm");
  EXPECT_STREQ(k[0].type, "string");
  EXPECT_STREQ(k[0].default_value, "\"ring\"");
  EXPECT_STREQ(k[0].description, "ring or \"tree\"");  // no bound, nothing added
  EXPECT_STREQ(k[1].name, "chunk_bytes");
  EXPECT_STREQ(k[1].type, "int");
  EXPECT_STREQ(k[1].default_value, "131072");
  EXPECT_STREQ(k[1].description, "pipeline chunk (at least 4096)");
  EXPECT_STREQ(k[2].description, "chunks in flight (in [1, 64])");
  EXPECT_STREQ(k[3].type, "int");
  EXPECT_STREQ(k[4].type, "float");
  EXPECT_STREQ(k[4].default_value, "0.5");
  EXPECT_STREQ(k[4].description, "a fraction (in [0, 1])");
  EXPECT_STREQ(k[5].type, "bool");
  EXPECT_STREQ(k[5].default_value, "false");
}

TEST(ConfigTable, ReadsTheValuesSetElseTheInitializers) {
  Keys k = keys().read(options("chunk_bytes = 4096\nalgorithm = \"tree\"\nratio = 1\nbad_default = 3\n"));
  EXPECT_EQ(k.algorithm, "tree");
  EXPECT_EQ(k.chunk_bytes, 4096);  // the bound is inclusive
  EXPECT_EQ(k.depth, 8);
  EXPECT_EQ(k.shards, 64u);
  EXPECT_DOUBLE_EQ(k.ratio, 1.0);
  EXPECT_FALSE(k.verbose);
}

TEST(ConfigTable, AValueOutOfBoundsNamesTheKeyTheValueAndTheBound) {
  EXPECT_THAT(error_of([] { keys().read(options("bad_default = 2\nchunk_bytes = 1024\n")); }),
              HasSubstr("mine.chunk_bytes = 1024 is out of bounds: must be at least 4096"));
  EXPECT_THAT(error_of([] { keys().read(options("bad_default = 2\ndepth = 65\n")); }),
              HasSubstr("mine.depth = 65 is out of bounds: must be in [1, 64]"));
  EXPECT_THAT(error_of([] { keys().read(options("bad_default = 2\nratio = 1.5\n")); }),
              HasSubstr("mine.ratio = 1.5 is out of bounds: must be in [0, 1]"));
  EXPECT_THAT(error_of([] { keys().read(options("bad_default = 2\nratio = nan\n")); }), HasSubstr("mine.ratio"));
  // Within the bound but not within the field's type.
  EXPECT_THAT(error_of([] { keys().read(options("bad_default = 2\nshards = 4294967296\n")); }),
              AllOf(HasSubstr("mine.shards = 4294967296"), HasSubstr("in [0, 4294967295]")));
  // A value of the wrong type still names the key (Options).
  EXPECT_THAT(error_of([] { keys().read(options("bad_default = 2\ndepth = \"8\"\n")); }), HasSubstr("'depth'"));
}

TEST(ConfigTable, ADefaultOutsideItsBoundIsThePluginsBug) {
  EXPECT_THAT(error_of([] { keys().read(options("")); }, DT_ERR_INTERNAL),
              AllOf(HasSubstr("mine.bad_default"), HasSubstr("default 1"), HasSubstr("at least 2")));
}

// ---- the in-tree plugins, as the core loads them -------------------------

bool built(const std::string& name) {
  return access((std::string(DTRAIN_BUILT_PLUGIN_DIR) + "/libdtrain_" + name + ".so").c_str(), F_OK) == 0;
}

const dtrain::ConfigKey* find_key(const dtrain::PluginInfo& info, const std::string& name) {
  for (const auto& k : info.config_keys)
    if (k.path == name) return &k;
  return nullptr;
}

// The message of create_communicator (one rank) with the given [NAME] table.
std::string create_error(const std::string& name, const std::string& toml) {
  dtrain::PluginRegistry reg({DTRAIN_BUILT_PLUGIN_DIR});
  auto b = reg.load(name);
  dtrain::CommOptions o;
  o.config_toml = toml;
  try {
    b->create_communicator(o);
  } catch (const dtrain::Error& e) {
    return e.what();
  }
  return "(created without error)";
}

TEST(PluginKeys, UcxShowsItsBoundsAndRefusesAChunkBelowThem) {
  if (!built("ucx")) GTEST_SKIP() << "the ucx plugin was not built";
  dtrain::PluginRegistry reg({DTRAIN_BUILT_PLUGIN_DIR});
  auto b = reg.load("ucx");
  const dtrain::ConfigKey* chunk = find_key(b->info(), "chunk_bytes");
  ASSERT_NE(chunk, nullptr);
  EXPECT_EQ(chunk->default_text, "131072");
  EXPECT_THAT(chunk->description, HasSubstr("(at least 4096)"));
  const dtrain::ConfigKey* depth = find_key(b->info(), "pipeline_depth");
  ASSERT_NE(depth, nullptr);
  EXPECT_THAT(depth->description, HasSubstr("(at least 1)"));
  // Before: raised to 4096 and 1 without a word.
  EXPECT_THAT(create_error("ucx", "chunk_bytes = 1024\n"),
              HasSubstr("ucx.chunk_bytes = 1024 is out of bounds: must be at least 4096"));
  EXPECT_THAT(create_error("ucx", "pipeline_depth = 0\n"),
              HasSubstr("ucx.pipeline_depth = 0 is out of bounds: must be at least 1"));
}

TEST(PluginKeys, GlooRefusesAValueOutOfBounds) {
  if (!built("gloo")) GTEST_SKIP() << "the gloo plugin was not built";
  EXPECT_THAT(create_error("gloo", "small_message_bytes = -1\n"),
              HasSubstr("gloo.small_message_bytes = -1 is out of bounds: must be at least 0"));
  EXPECT_THAT(create_error("gloo", "bcube_base = 1\n"),
              HasSubstr("gloo.bcube_base = 1 is out of bounds: must be at least 2"));
}

}  // namespace
