#include "dtrain/config.h"
#include "dtrain/config_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "dtrain/error.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

template <typename F>
ConfigError config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ConfigError, got: " << e.what();
    return ConfigError("", 0, 0, "", "wrong exception");
  }
  ADD_FAILURE() << "expected ConfigError, nothing was thrown";
  return ConfigError("", 0, 0, "", "nothing thrown");
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("dtrain_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    std::string p = (path_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

ConfigSchema train_schema() {
  ConfigSchema s;
  s.add("name", ConfigType::String)
      .add("train.epochs", ConfigType::Int, "10")
      .add("train.lr", ConfigType::Float, "0.1")
      .add("train.shuffle", ConfigType::Bool)
      .add("train.files", ConfigType::StringList)
      .add("train.sizes", ConfigType::IntList)
      .add("communicator.timeout_s", ConfigType::Int)
      .add("plugins.path", ConfigType::StringList)
      .add_open_table("plugins.gloo");
  return s;
}

TEST(ConfigTest, SyntaxErrorHasFileLineAndColumn) {
  ConfigError e = config_error([] { Config::from_string("x = 1\ny = 2\nz = @\n", "file.toml"); });
  EXPECT_THAT(e.what(), HasSubstr("file.toml:3:5:"));
  EXPECT_EQ(e.file(), "file.toml");
  EXPECT_EQ(e.line(), 3);
  EXPECT_EQ(e.column(), 5);
  EXPECT_EQ(e.kind(), ErrorKind::Config);
}

TEST(ConfigTest, SyntaxErrorFromFileNamesThePath) {
  TempDir dir;
  std::string path = dir.write("file.toml", "[train]\nepochs = 3\nlr = [1,\n  2, x]\n");
  ConfigError e = config_error([&] { Config::from_file(path); });
  EXPECT_THAT(e.what(), HasSubstr(path + ":4:6:"));
  EXPECT_EQ(e.line(), 4);
  EXPECT_EQ(e.column(), 6);
}

TEST(ConfigTest, MissingFileNamesThePath) {
  TempDir dir;
  std::string path = dir.path("absent.toml");
  ConfigError e = config_error([&] { Config::from_file(path); });
  EXPECT_EQ(e.file(), path);
  EXPECT_THAT(e.what(), HasSubstr(path));
  EXPECT_THAT(e.what(), HasSubstr("does not exist"));

  ConfigError d = config_error([&] { Config::from_file(dir.path("")); });
  EXPECT_THAT(d.what(), HasSubstr("directory"));
}

TEST(ConfigTest, FromFileReadsValues) {
  TempDir dir;
  std::string path = dir.write("job.toml", "name = \"mnist\"\n[train]\nepochs = 3\nlr = 0.5\n");
  Config c = Config::from_file(path, {"train.epochs=7"});
  EXPECT_EQ(c.source(), path);
  EXPECT_EQ(c.get_string("name"), "mnist");
  EXPECT_EQ(c.get_int("train.epochs"), 7);
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 0.5);
  EXPECT_NO_THROW(c.validate(train_schema()));
}

TEST(ConfigTest, UnknownKeyNamesKeyLineAndSuggestion) {
  Config c = Config::from_string("[train]\nlr = 0.1\nepoch = 3\n", "job.toml");
  ConfigError e = config_error([&] { c.validate(train_schema()); });
  EXPECT_THAT(e.what(), HasSubstr("job.toml:3:1:"));
  EXPECT_THAT(e.what(), HasSubstr("unknown key 'train.epoch'; did you mean 'train.epochs'?"));
  EXPECT_EQ(e.line(), 3);
}

TEST(ConfigTest, UnknownTableGetsSuggestion) {
  Config c = Config::from_string("name = \"x\"\n\n[comunicator]\ntimeout_s = 5\n", "job.toml");
  ConfigError e = config_error([&] { c.validate(train_schema()); });
  EXPECT_THAT(e.what(), HasSubstr("job.toml:3:"));
  EXPECT_THAT(e.what(), HasSubstr("unknown key 'comunicator'; did you mean 'communicator'?"));
}

TEST(ConfigTest, UnknownKeyWithoutCloseMatchHasNoSuggestion) {
  Config c = Config::from_string("[train]\nepochs = 3\nbanana_split = 1\n", "job.toml");
  ConfigError e = config_error([&] { c.validate(train_schema()); });
  EXPECT_THAT(e.what(), HasSubstr("unknown key 'train.banana_split'"));
  EXPECT_THAT(e.what(), Not(HasSubstr("did you mean")));
  EXPECT_EQ(e.line(), 3);
}

TEST(ConfigTest, UnknownKeyInWrongTableSuggestsTheRightOne) {
  Config c = Config::from_string("[communicator]\nepochs = 3\n", "job.toml");
  ConfigError e = config_error([&] { c.validate(train_schema()); });
  EXPECT_THAT(e.what(), HasSubstr("did you mean 'train.epochs'?"));
}

TEST(ConfigTest, WrongTypeNamesExpectedAndGotTypes) {
  Config c = Config::from_string("[train]\nepochs = \"ten\"\n", "job.toml");
  ConfigError e = config_error([&] { c.validate(train_schema()); });
  EXPECT_THAT(e.what(), HasSubstr("job.toml:2:10:"));
  EXPECT_THAT(e.what(), HasSubstr("key 'train.epochs'"));
  EXPECT_THAT(e.what(), HasSubstr("must be int, got string \"ten\""));
  EXPECT_EQ(e.key(), "train.epochs");

  Config f = Config::from_string("[train]\nshuffle = 1\n", "job.toml");
  EXPECT_THAT(config_error([&] { f.validate(train_schema()); }).what(), HasSubstr("must be bool, got int 1"));

  Config l = Config::from_string("[train]\nfiles = [1, 2]\n", "job.toml");
  EXPECT_THAT(config_error([&] { l.validate(train_schema()); }).what(),
              HasSubstr("must be array of strings, got array [1, 2]"));

  Config i = Config::from_string("[train]\nsizes = [1, \"2\"]\n", "job.toml");
  EXPECT_THAT(config_error([&] { i.validate(train_schema()); }).what(),
              HasSubstr("must be array of ints, got array [1, \"2\"]"));

  Config t = Config::from_string("train = 3\n", "job.toml");
  EXPECT_THAT(config_error([&] { t.validate(train_schema()); }).what(), HasSubstr("unknown key 'train'"));
}

TEST(ConfigTest, IntAcceptedForFloatAndListsValidate) {
  Config c = Config::from_string(
      "name = \"a\"\n[train]\nlr = 1\nepochs = 2\nshuffle = true\nfiles = [\"a\", \"b\"]\nsizes = [1, 2]\n",
      "job.toml");
  EXPECT_NO_THROW(c.validate(train_schema()));
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 1.0);
  EXPECT_EQ(c.get_string_list("train.files"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.get_int_list("train.sizes"), (std::vector<int64_t>{1, 2}));
}

TEST(ConfigTest, OpenTablesAreSkipped) {
  Config c = Config::from_string(
      "[plugins]\npath = [\"/opt\"]\n[plugins.gloo]\nanything = 1\n[plugins.gloo.deep]\nx = \"y\"\n", "job.toml");
  EXPECT_NO_THROW(c.validate(train_schema()));
  Config bad = Config::from_string("[plugins]\ngloo = 3\n", "job.toml");
  EXPECT_THAT(config_error([&] { bad.validate(train_schema()); }).what(), HasSubstr("must be table, got int 3"));
  Config sibling = Config::from_string("[plugins.ucx]\nanything = 1\n", "job.toml");
  EXPECT_THAT(config_error([&] { sibling.validate(train_schema()); }).what(), HasSubstr("unknown key 'plugins.ucx'"));
}

TEST(ConfigTest, OverrideTypes) {
  Config c = Config::from_string("[train]\nepochs = 3\n", "job.toml");
  c.apply_override("train.epochs=42");
  c.apply_override("train.lr=0.25");
  c.apply_override("train.shuffle=true");
  c.apply_override("name=hello world");
  c.apply_override("quoted=\"42\"");
  c.apply_override("train.sizes=[1, 2, 3]");
  c.apply_override(" train.files = [\"a\", \"b\"] ");
  c.apply_override("empty=");
  EXPECT_EQ(c.get_int("train.epochs"), 42);
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 0.25);
  EXPECT_TRUE(c.get_bool("train.shuffle"));
  EXPECT_EQ(c.get_string("name"), "hello world");
  EXPECT_EQ(c.get_string("quoted"), "42");
  EXPECT_EQ(c.get_int_list("train.sizes"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(c.get_string_list("train.files"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.get_string("empty", "x"), "");
  EXPECT_THROW(c.get_int("quoted"), ConfigError);
}

TEST(ConfigTest, OverrideCreatesTables) {
  Config c = Config::from_string("name = \"x\"\n", "job.toml", {"new.sub.key=1", "new.other=\"s\""});
  EXPECT_EQ(c.get_int("new.sub.key"), 1);
  EXPECT_EQ(c.get_string("new.other"), "s");
  EXPECT_EQ(c.keys_of("new"), (std::vector<std::string>{"sub", "other"}));
  ConfigLocation loc = c.location_of("new.sub.key");
  EXPECT_EQ(loc.file, "-o new.sub.key=1");
  EXPECT_EQ(loc.line, 0);
  EXPECT_EQ(loc.str(), "-o new.sub.key=1");
}

TEST(ConfigTest, OverrideIntoNonTableFails) {
  Config c = Config::from_string("[train]\nepochs = 3\n", "job.toml");
  ConfigError e = config_error([&] { c.apply_override("train.epochs.x=1"); });
  EXPECT_EQ(e.file(), "-o train.epochs.x=1");
  EXPECT_EQ(e.line(), 0);
  EXPECT_THAT(e.what(), HasSubstr("-o train.epochs.x=1: "));
  EXPECT_THAT(e.what(), HasSubstr("not a table"));
  EXPECT_EQ(c.get_int("train.epochs"), 3);

  ConfigError t = config_error([&] { c.apply_override("train=5"); });
  EXPECT_EQ(t.file(), "-o train=5");
  EXPECT_THAT(t.what(), HasSubstr("is a table"));

  ConfigError n = config_error([&] { c.apply_override("no_equals_sign"); });
  EXPECT_EQ(n.file(), "-o no_equals_sign");
  ConfigError k = config_error([&] { c.apply_override("a..b=1"); });
  EXPECT_THAT(k.what(), HasSubstr("not a valid TOML key"));

  ConfigError f = config_error([] { Config::from_string("a = 1\n", "job.toml", {"a.b=2"}); });
  EXPECT_EQ(f.file(), "-o a.b=2");
}

TEST(ConfigTest, OverrideThenValidateReportsOverrideAsSource) {
  Config c = Config::from_string("[train]\nepochs = 3\n", "job.toml", {"train.epochs=many"});
  ConfigError e = config_error([&] { c.validate(train_schema()); });
  EXPECT_EQ(e.file(), "-o train.epochs=many");
  EXPECT_THAT(e.what(), HasSubstr("must be int, got string \"many\""));
}

TEST(ConfigTest, TableAsFlatToml) {
  Config c = Config::from_string(
      "[plugin]\n"
      "name = \"gloo\"\n"
      "threads = 4\n"
      "[plugin.tcp]\n"
      "port = 6170\n"
      "hosts = [\"a\", \"b\"]\n"
      "ratio = 0.5\n"
      "whole = 2.0\n"
      "flag = true\n"
      "quote = 'say \"hi\"\\n'\n"
      "inline = { b = 2, a = 1 }\n"
      "[other]\n"
      "x = 1\n",
      "job.toml");
  EXPECT_EQ(c.table_as_flat_toml("plugin"),
            "name = \"gloo\"\n"
            "threads = 4\n"
            "tcp.port = 6170\n"
            "tcp.hosts = [\"a\", \"b\"]\n"
            "tcp.ratio = 0.5\n"
            "tcp.whole = 2.0\n"
            "tcp.flag = true\n"
            "tcp.quote = \"say \\\"hi\\\"\\\\n\"\n"
            "tcp.inline.b = 2\n"
            "tcp.inline.a = 1\n");
  EXPECT_EQ(c.table_as_flat_toml("absent"), "");
  EXPECT_THROW(c.table_as_flat_toml("plugin.threads"), ConfigError);

  Config round = Config::from_string(c.table_as_flat_toml("plugin"), "flat");
  EXPECT_EQ(round.get_string("tcp.quote"), "say \"hi\"\\n");
  EXPECT_DOUBLE_EQ(round.get_float("tcp.whole"), 2.0);
  EXPECT_FALSE(round.has("other"));
}

TEST(ConfigTest, TypedGettersThrowWithLocation) {
  Config c = Config::from_string("[train]\nepochs = 3\nlr = \"fast\"\n", "job.toml");
  EXPECT_EQ(c.get_int("train.missing", 9), 9);
  EXPECT_EQ(c.get_string("train.missing", "d"), "d");
  EXPECT_TRUE(c.get_string_list("train.missing").empty());
  EXPECT_DOUBLE_EQ(c.get_float("train.epochs"), 3.0);
  ConfigError e = config_error([&] { c.get_float("train.lr"); });
  EXPECT_EQ(e.line(), 3);
  EXPECT_EQ(e.column(), 6);
  EXPECT_EQ(e.key(), "train.lr");
  EXPECT_THAT(e.what(), HasSubstr("job.toml:3:6: key 'train.lr': must be float, got string \"fast\""));
  EXPECT_THROW(c.get_int("train.lr"), ConfigError);
  EXPECT_THROW(c.get_bool("train.epochs"), ConfigError);
  EXPECT_THROW(c.get_string("train.epochs"), ConfigError);
  EXPECT_THROW(c.get_string_list("train.epochs"), ConfigError);
  EXPECT_THROW(c.get_int_list("train.lr"), ConfigError);
  EXPECT_FALSE(c.has("train.epochs.x"));
  EXPECT_TRUE(c.has("train"));
}

TEST(ConfigTest, FloatListTakesIntegersAndFloatsAndRefusesStrings) {
  Config c = Config::from_string("[eval]\nscales = [0.75, 1, 1.25]\nbad = [1.0, \"x\"]\n", "job.toml");
  EXPECT_EQ(c.get_float_list("eval.scales"), (std::vector<double>{0.75, 1.0, 1.25}));
  EXPECT_TRUE(c.get_float_list("eval.missing").empty());
  ConfigError e = config_error([&] { c.get_float_list("eval.bad"); });
  EXPECT_EQ(e.line(), 3);
  EXPECT_THAT(e.what(), HasSubstr("key 'eval.bad': must be array of numbers"));
  ConfigSchema s;
  s.add("eval.scales", ConfigType::FloatList).add("eval.bad", ConfigType::FloatList);
  ConfigError v = config_error([&] { c.validate(s); });
  EXPECT_EQ(v.key(), "eval.bad");
}

TEST(ConfigTest, KeysOfIsInDocumentOrderAndLocationsAreKept) {
  Config c = Config::from_string("zeta = 1\nalpha = 2\n[mid]\nb = 1\na = 2\n", "job.toml");
  EXPECT_EQ(c.keys_of(""), (std::vector<std::string>{"zeta", "alpha", "mid"}));
  EXPECT_EQ(c.keys_of("mid"), (std::vector<std::string>{"b", "a"}));
  EXPECT_TRUE(c.keys_of("absent").empty());
  ConfigLocation loc = c.location_of("mid.a");
  EXPECT_EQ(loc.file, "job.toml");
  EXPECT_EQ(loc.line, 5);
  EXPECT_EQ(loc.column, 5);
  EXPECT_EQ(loc.str(), "job.toml:5:5");
  EXPECT_EQ(c.location_of("mid").line, 3);

  Config copy = c;
  EXPECT_EQ(copy.location_of("mid.a").str(), "job.toml:5:5");
  copy.apply_override("mid.a=7");
  EXPECT_EQ(copy.get_int("mid.a"), 7);
  EXPECT_EQ(c.get_int("mid.a"), 2);
  Config moved = std::move(copy);
  EXPECT_EQ(moved.get_int("mid.a"), 7);
  Config assigned;
  assigned = c;
  EXPECT_EQ(assigned.location_of("zeta").line, 1);
}

TEST(ConfigTest, DumpRoundTrips) {
  Config c = Config::from_string("name = \"n\"\n[a]\nx = 1\n[a.b]\ny = [\"p\", \"q\"]\n", "job.toml", {"a.z=0.5"});
  Config back = Config::from_string(c.dump(), "dump");
  EXPECT_EQ(back.get_string("name"), "n");
  EXPECT_EQ(back.get_int("a.x"), 1);
  EXPECT_DOUBLE_EQ(back.get_float("a.z"), 0.5);
  EXPECT_EQ(back.get_string_list("a.b.y"), (std::vector<std::string>{"p", "q"}));
}

TEST(ConfigTest, SetLiteral) {
  Config c;
  c.set_literal("a.b", "[1, 2]");
  c.set_literal("a.c", "\"text\"");
  EXPECT_EQ(c.get_int_list("a.b"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(c.get_string("a.c"), "text");
  EXPECT_THROW(c.set_literal("a.d", "not a literal"), ConfigError);
  EXPECT_THROW(c.set_literal("", "1"), InvalidUsage);
}

TEST(ConfigTest, ClosestMatch) {
  EXPECT_EQ(closest_match("epoch", {"epochs", "lr"}), "epochs");
  EXPECT_EQ(closest_match("timeout", {"timeout_s", "retries"}), "timeout_s");
  EXPECT_EQ(closest_match("banana", {"epochs", "lr"}), "");
  EXPECT_EQ(closest_match("x", {}), "");
  EXPECT_EQ(closest_match("communicator.timout_s", {"communicator.timeout_s", "train.epochs"}),
            "communicator.timeout_s");
}

TEST(ConfigTest, ConfigTypeNames) {
  EXPECT_STREQ(to_string(ConfigType::Int), "int");
  EXPECT_STREQ(to_string(ConfigType::StringList), "array of strings");
  ConfigSchema s = train_schema();
  ASSERT_NE(s.find("train.lr"), nullptr);
  EXPECT_EQ(s.find("train.lr")->type, ConfigType::Float);
  EXPECT_EQ(s.find("train.nope"), nullptr);
}

TEST(ConfigDefaultsTest, GettersWithoutFallbackReturnTheDeclaredDefault) {
  Config c = Config::from_string("[train]\nlr = 0.5\n", "job.toml");
  c.validate(train_schema());
  EXPECT_EQ(c.get_int("train.epochs"), 10);  // absent: the schema's default
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 0.5);
  EXPECT_EQ(c.get_int("train.epochs", 3), 3);  // an explicit fallback still wins for an absent key
  ASSERT_NE(c.schema(), nullptr);
  // Declared without a default, or not declared at all: the read site's bug, named.
  try {
    c.get_bool("train.shuffle");
    ADD_FAILURE() << "no throw";
  } catch (const InvalidUsage& e) {
    EXPECT_THAT(e.what(), HasSubstr("train.shuffle"));
    EXPECT_THAT(e.what(), HasSubstr("no default"));
  }
  EXPECT_THROW(c.get_int("train.nope"), InvalidUsage);
  EXPECT_TRUE(c.get_string_list("train.files").empty());
}

TEST(ConfigDefaultsTest, AnUnvalidatedConfigTakesTheCoresDefaults) {
  Config c;
  EXPECT_EQ(c.get_string("job.backend"), "gloo");
  EXPECT_DOUBLE_EQ(c.get_float("communicator.timeout_s"), 300.0);
  EXPECT_EQ(c.get_int("strategy.gradient_merge.k_steps"), 1);
  EXPECT_EQ(c.get_string("ps.backend"), "ps_grpc");
}

TEST(ConfigDefaultsTest, AKeyIsDeclaredOnceWithADefaultOfItsType) {
  ConfigSchema s = train_schema();
  // An app cannot restate a key the trainer declares, with the same or another default.
  try {
    s.add("train.epochs", ConfigType::Int, "1");
    ADD_FAILURE() << "no throw";
  } catch (const InvalidUsage& e) {
    EXPECT_THAT(e.what(), HasSubstr("'train.epochs' is declared twice"));
  }
  EXPECT_THROW(s.add("train.a", ConfigType::Int, "\"ten\""), InvalidUsage);
  EXPECT_THROW(s.add("train.b", ConfigType::String, "false"), InvalidUsage);
  EXPECT_THROW(s.add("train.c", ConfigType::IntList, "[1.5]"), InvalidUsage);
  EXPECT_NO_THROW(s.add("train.d", ConfigType::Float, "1"));                       // an int is a float
  EXPECT_THROW(s.add("train.e", ConfigType::Int, "0").at_least(1), InvalidUsage);  // default out of its range
  EXPECT_THROW(s.add("train.f", ConfigType::String, "\"x\"").at_least(1), InvalidUsage);
}

TEST(ConfigDefaultsTest, ValidateChecksRangesAndNamesTheLine) {
  ConfigSchema s;
  s.add("train.batch", ConfigType::Int, "8").at_least(1);
  s.add("train.p", ConfigType::Float, "0.5").in_range(0, 1);
  Config::from_string("[train]\nbatch = 1\np = 1\n", "ok.toml").validate(s);
  ConfigError e = config_error([&] { Config::from_string("[train]\nbatch = 0\n", "job.toml").validate(s); });
  EXPECT_EQ(e.line(), 2);
  EXPECT_THAT(e.what(), HasSubstr("train.batch"));
  EXPECT_THAT(e.what(), HasSubstr(">= 1, got 0"));
  e = config_error([&] { Config::from_string("[train]\np = 1.5\n", "job.toml").validate(s); });
  EXPECT_THAT(e.what(), HasSubstr("in [0, 1], got 1.5"));
}

struct TableOptions {
  int64_t epochs = 10;
  double lr = 0.25;
  bool shuffle = true;
  std::string name = "say \"hi\"";
  std::vector<int64_t> milestones{3, 5};
};

TEST(ConfigTableTest, TheFieldsInitializerIsTheKeysOneDefault) {
  ConfigTable<TableOptions> t;
  t.add("train.epochs", &TableOptions::epochs, "passes").at_least(1);
  t.add("train.lr", &TableOptions::lr, "rate").in_range(0, 1);
  t.add("train.shuffle", &TableOptions::shuffle, "");
  t.add("train.name", &TableOptions::name, "");
  t.add("train.milestones", &TableOptions::milestones, "");
  ConfigSchema s;
  t.declare(s);
  EXPECT_EQ(s.find("train.epochs")->default_text, "10");
  EXPECT_EQ(s.find("train.lr")->default_text, "0.25");
  EXPECT_EQ(s.find("train.shuffle")->default_text, "true");
  EXPECT_EQ(s.find("train.name")->default_text, "\"say \\\"hi\\\"\"");
  EXPECT_EQ(s.find("train.milestones")->default_text, "[3, 5]");
  EXPECT_EQ(*s.find("train.epochs")->min, 1);

  Config c = Config::from_string("[train]\nepochs = 3\nshuffle = false\n", "job.toml");
  c.validate(s);
  TableOptions o = t.read(c);
  EXPECT_EQ(o.epochs, 3);
  EXPECT_FALSE(o.shuffle);
  EXPECT_DOUBLE_EQ(o.lr, 0.25);
  EXPECT_EQ(o.name, "say \"hi\"");  // the default, read back through the schema's literal
  EXPECT_EQ(o.milestones, (std::vector<int64_t>{3, 5}));
  // read() checks ranges itself (a config that was never validated).
  ConfigError e = config_error([&] { t.read(Config::from_string("[train]\nlr = 2.0\n", "x.toml")); });
  EXPECT_EQ(e.line(), 2);
  EXPECT_THAT(e.what(), HasSubstr("in [0, 1], got 2"));
}

}  // namespace
}  // namespace dtrain
