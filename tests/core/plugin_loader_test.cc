#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/error.h"
#include "dtrain/communicator.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/sdk/support.h"

using namespace dtrain;
using ::testing::AllOf;
using ::testing::HasSubstr;

namespace {

std::string load_error(const std::string& name) {
  PluginRegistry reg({DTRAIN_BAD_PLUGIN_DIR});
  try {
    reg.load(name);
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded without error)";
}

// These tests load the gloo plugin; a build without it skips them.
bool gloo_built() { return access((std::string(DTRAIN_BUILT_PLUGIN_DIR) + "/libdtrain_gloo.so").c_str(), F_OK) == 0; }
#define REQUIRE_GLOO() \
  if (!gloo_built()) GTEST_SKIP() << "the gloo plugin was not built (DTRAIN_WITH_GLOO=OFF or Gloo missing)"

}  // namespace

TEST(PluginLoader, FindsGlooInTheInstallFolderWithoutEnvironment) {
  REQUIRE_GLOO();
  PluginRegistry reg;
  auto b = reg.load("gloo");
  EXPECT_EQ(b->info().name, "gloo");
  EXPECT_EQ(b->info().abi_major, DT_BACKEND_V1_MAJOR);
  EXPECT_TRUE(b->supports(DT_CAP_ALLREDUCE | DT_CAP_SENDRECV | DT_CAP_CPU_BUFFERS));
  EXPECT_TRUE(b->supports(DT_CAP_CUDA_BUFFERS)) << "CUDA buffers through pinned host staging";
  EXPECT_THAT(b->info().caps_string(), HasSubstr("allreduce"));
  EXPECT_EQ(reg.load("gloo").get(), b.get()) << "a plugin is loaded once per process";
}

TEST(PluginLoader, UnknownBackendListsInstalledOnes) {
  REQUIRE_GLOO();
  PluginRegistry reg;
  try {
    reg.load("nosuchbackend");
    FAIL() << "expected an error";
  } catch (const NotSupported& e) {
    EXPECT_THAT(e.what(),
                AllOf(HasSubstr("no backend 'nosuchbackend'"), HasSubstr("Installed backends:"), HasSubstr("gloo")));
  }
}

TEST(PluginLoader, NotASharedLibrary) {
  EXPECT_THAT(load_error("notaso"), AllOf(HasSubstr("libdtrain_notaso.so"), HasSubstr("is not a shared library")));
}

TEST(PluginLoader, MissingEntrySymbol) {
  EXPECT_THAT(load_error("noentry"), AllOf(HasSubstr("exports no entry point"), HasSubstr("dtrain_backend_v1")));
}

TEST(PluginLoader, WrongAbiMajor) {
  EXPECT_THAT(load_error("badabi"), AllOf(HasSubstr("built for backend ABI 99"), HasSubstr("this core speaks ABI 1")));
}

TEST(PluginLoader, TooSmallStructSize) {
  EXPECT_THAT(load_error("smallstruct"), AllOf(HasSubstr("table of 24 bytes"), HasSubstr("smaller than")));
}

TEST(PluginLoader, DeclaredNameDiffersFromFileName) {
  EXPECT_THAT(load_error("misnamed"),
              AllOf(HasSubstr("declares the backend name 'someone_else'"), HasSubstr("file name says 'misnamed'")));
}

TEST(PluginLoader, UnresolvedSymbols) {
  EXPECT_THAT(load_error("unresolved"),
              AllOf(HasSubstr("unresolved symbols"), HasSubstr("dtrain_test_symbol_that_does_not_exist")));
}

TEST(PluginLoader, ListReportsBrokenPluginsWithoutThrowing) {
  REQUIRE_GLOO();
  PluginRegistry reg({DTRAIN_BAD_PLUGIN_DIR});
  std::vector<std::string> errors;
  auto infos = reg.list(&errors);
  bool has_gloo = false;
  for (auto& i : infos) has_gloo |= i.name == "gloo";
  EXPECT_TRUE(has_gloo);
  // 5 bad flavours, notaso and psnull (PS caps with NULL slots); v10 loads.
  EXPECT_EQ(errors.size(), 7u);
}

TEST(PluginLoader, PathInsteadOfNameIsRefused) {
  PluginRegistry reg;
  EXPECT_THROW(reg.load("../gloo"), InvalidUsage);
}

TEST(PluginLoader, UnknownPluginOptionIsAConfigError) {
  REQUIRE_GLOO();
  PluginRegistry reg;
  auto b = reg.load("gloo");
  CommOptions o;
  o.config_toml = "algoritm = \"ring\"\n";
  try {
    b->create_communicator(o);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("algoritm"), HasSubstr("did you mean 'algorithm'")));
  }
}

// The SDK reads a plugin's options as typed TOML literals: a value of the
// wrong type is an error that names the key, never a silent 0.
TEST(PluginOptions, ReadsTypedTomlLiterals) {
  sdk::Options o(
      "chunk_bytes = 131_072\nmask = 0xff\nratio = -2.5e-1\non = true\n"
      "name = \"a \\\"q\\\" \\u00e9\"\nraw = 'C:\\x'\n");
  EXPECT_EQ(o.get_int("chunk_bytes", 0), 131072);
  EXPECT_EQ(o.get_int("mask", 0), 255);
  EXPECT_DOUBLE_EQ(o.get_float("ratio", 0), -0.25);
  EXPECT_TRUE(o.get_bool("on", false));
  EXPECT_EQ(o.get_string("name", ""), "a \"q\" \xc3\xa9");
  EXPECT_EQ(o.get_string("raw", ""), "C:\\x");
  EXPECT_EQ(o.get_int("absent", 7), 7);
}

TEST(PluginOptions, AValueThePluginCannotReadNamesTheKey) {
  sdk::Options o(
      "chunk_bytes = \"128k\"\ndepth = 12x\nspin = 1__0\non = yes\nratio = 1.5.2\nname = 42\n"
      "huge = 99999999999999999999\n");
  auto error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const sdk::Error& e) {
      EXPECT_EQ(e.status(), DT_ERR_INVALID_USAGE);
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_THAT(error_of([&] { o.get_int("chunk_bytes", 0); }), AllOf(HasSubstr("'chunk_bytes'"), HasSubstr("integer")));
  EXPECT_THAT(error_of([&] { o.get_int("depth", 0); }), HasSubstr("'depth' = 12x"));
  EXPECT_THAT(error_of([&] { o.get_int("spin", 0); }), HasSubstr("'spin'"));
  EXPECT_THAT(error_of([&] { o.get_int("huge", 0); }), HasSubstr("'huge'"));
  EXPECT_THAT(error_of([&] { o.get_bool("on", false); }), HasSubstr("'on' = yes is not true or false"));
  EXPECT_THAT(error_of([&] { o.get_float("ratio", 0); }), HasSubstr("'ratio'"));
  EXPECT_THAT(error_of([&] { o.get_string("name", ""); }), HasSubstr("'name' = 42 is not a string"));
  EXPECT_THAT(error_of([] { sdk::Options("just words\n"); }), HasSubstr("line 1"));
}

// A getter without a fallback reads the value set, else the default the
// plugin's key table declares (the one place a default is written); a key
// the table does not declare, a required key not set, a getter of another
// type and a declared default not of its type are errors that name the key.
TEST(PluginOptions, GettersWithoutAFallbackReadTheKeyTable) {
  static const dt_config_key_v1_t keys[] = {
      {"chunk_bytes", "int", "131_072", ""}, {"algorithm", "string", "\"auto\"", ""},
      {"ratio", "float", "0.5", ""},         {"on", "bool", "true", ""},
      {"required", "int", "", ""},           {"broken", "int", "\"x\"", ""},
  };
  sdk::Options o("algorithm = \"ring\"\nratio = 2\n", keys, sizeof(keys) / sizeof(keys[0]));
  EXPECT_EQ(o.get_int("chunk_bytes"), 131072);
  EXPECT_EQ(o.get_string("algorithm"), "ring");
  EXPECT_DOUBLE_EQ(o.get_float("ratio"), 2.0);
  EXPECT_TRUE(o.get_bool("on"));
  EXPECT_TRUE(o.declared("required"));
  EXPECT_FALSE(o.has("required"));
  EXPECT_EQ(o.get_int("chunk_bytes", 7), 7);  // a fallback still wins over the table for an unset key
  auto error_of = [](auto&& f, dt_status_t want) -> std::string {
    try {
      f();
    } catch (const sdk::Error& e) {
      EXPECT_EQ(e.status(), want) << e.what();
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_THAT(error_of([&] { o.get_int("absent"); }, DT_ERR_INTERNAL),
              AllOf(HasSubstr("'absent'"), HasSubstr("key table")));
  EXPECT_THAT(error_of([&] { o.get_int("required"); }, DT_ERR_INVALID_USAGE),
              AllOf(HasSubstr("'required'"), HasSubstr("not set")));
  EXPECT_THAT(error_of([&] { o.get_int("broken"); }, DT_ERR_INTERNAL),
              AllOf(HasSubstr("'broken'"), HasSubstr("\"x\""), HasSubstr("integer")));
  EXPECT_THAT(error_of([&] { o.get_string("chunk_bytes"); }, DT_ERR_INTERNAL),
              AllOf(HasSubstr("'chunk_bytes'"), HasSubstr("declared as int")));
}
