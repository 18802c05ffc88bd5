#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/error.h"
#include "dtrain/communicator.h"
#include "dtrain/plugin_registry.h"

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

}  // namespace

TEST(PluginLoader, FindsGlooInTheInstallFolderWithoutEnvironment) {
  PluginRegistry reg;
  auto b = reg.load("gloo");
  EXPECT_EQ(b->info().name, "gloo");
  EXPECT_EQ(b->info().abi_major, DT_BACKEND_V1_MAJOR);
  EXPECT_TRUE(b->supports(DT_CAP_ALLREDUCE | DT_CAP_SENDRECV | DT_CAP_CPU_BUFFERS));
  EXPECT_FALSE(b->supports(DT_CAP_CUDA_BUFFERS));
  EXPECT_THAT(b->info().caps_string(), HasSubstr("allreduce"));
  EXPECT_EQ(reg.load("gloo").get(), b.get()) << "a plugin is loaded once per process";
}

TEST(PluginLoader, UnknownBackendListsInstalledOnes) {
  PluginRegistry reg;
  try {
    reg.load("nosuchbackend");
    FAIL() << "expected an error";
  } catch (const NotSupported& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("no backend 'nosuchbackend'"), HasSubstr("Installed backends:"),
                                HasSubstr("gloo")));
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
  PluginRegistry reg({DTRAIN_BAD_PLUGIN_DIR});
  std::vector<std::string> errors;
  auto infos = reg.list(&errors);
  bool has_gloo = false;
  for (auto& i : infos) has_gloo |= i.name == "gloo";
  EXPECT_TRUE(has_gloo);
  EXPECT_EQ(errors.size(), 6u);
}

TEST(PluginLoader, PathInsteadOfNameIsRefused) {
  PluginRegistry reg;
  EXPECT_THROW(reg.load("../gloo"), InvalidUsage);
}

TEST(PluginLoader, UnknownPluginOptionIsAConfigError) {
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
