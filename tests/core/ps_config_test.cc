// TableConfig::from_config and the [ps] keys: every field read, and every bad
// value a ConfigError naming the file, line and key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/config.h"
#include "dtrain/error.h"
#include "dtrain/ps.h"
#include "job_text.h"

using namespace dtrain;
using namespace dtrain::ps;
using ::testing::HasSubstr;

namespace {

Config job(const std::string& text) { return dtrain::test::job_text(text, add_ps_keys); }

struct Failure {
  std::string what, key;
  int line = 0;
};

Failure table_error(const std::string& text, const std::string& name = "emb") {
  Config c = job(text);
  try {
    TableConfig::from_config(c, name);
  } catch (const ConfigError& e) {
    return {e.what(), e.key(), e.line()};
  }
  ADD_FAILURE() << "accepted:\n" << text;
  return {};
}

}  // namespace

TEST(PsTableConfig, ReadsEveryField) {
  TableConfig t = TableConfig::from_config(job(R"([ps]
backend = "ps_grpc"
[ps.tables.emb]
kind = "sparse"
dim = 8
optimizer = "adam"
learning_rate = 0.05
beta1 = 0.8
beta2 = 0.99
epsilon = 1e-6
initial_g2sum = 0.5
initializer = "uniform"
init_a = -0.01
init_b = 0.01
seed = 7
admit_count = 3
admit_probability = 0.5
decay_rate = 0.98
nonclk_coeff = 0.1
click_coeff = 2.0
delete_threshold = 0.8
delete_after_unseen_days = 30
)"),
                                           "emb");
  EXPECT_EQ(t.name, "emb");
  EXPECT_EQ(t.kind, TableKind::Sparse);
  EXPECT_EQ(t.dim, 8u);
  EXPECT_EQ(t.optimizer, Optimizer::Adam);
  EXPECT_DOUBLE_EQ(t.learning_rate, 0.05);
  EXPECT_DOUBLE_EQ(t.beta1, 0.8);
  EXPECT_DOUBLE_EQ(t.beta2, 0.99);
  EXPECT_DOUBLE_EQ(t.epsilon, 1e-6);
  EXPECT_DOUBLE_EQ(t.initial_g2sum, 0.5);
  EXPECT_EQ(t.initializer, Initializer::Uniform);
  EXPECT_DOUBLE_EQ(t.init_a, -0.01);
  EXPECT_DOUBLE_EQ(t.init_b, 0.01);
  EXPECT_EQ(t.seed, 7u);
  EXPECT_EQ(t.admit_count, 3u);
  EXPECT_DOUBLE_EQ(t.admit_probability, 0.5);
  EXPECT_DOUBLE_EQ(t.decay_rate, 0.98);
  EXPECT_DOUBLE_EQ(t.nonclk_coeff, 0.1);
  EXPECT_DOUBLE_EQ(t.click_coeff, 2.0);
  EXPECT_DOUBLE_EQ(t.delete_threshold, 0.8);
  EXPECT_EQ(t.delete_after_unseen_days, 30u);
  EXPECT_STREQ(to_string(t.optimizer), "adam");

  TableConfig d = TableConfig::from_config(job("[ps.tables.w]\nkind = \"dense\"\ndim = 100\n"), "w");
  EXPECT_EQ(d.kind, TableKind::Dense);
  EXPECT_EQ(d.dim, 100u);
  EXPECT_EQ(d.optimizer, Optimizer::Sgd);
  EXPECT_EQ(d.initializer, Initializer::Constant);
  EXPECT_DOUBLE_EQ(d.learning_rate, 0.01);
}

TEST(PsTableConfig, BadValuesNameFileLineAndKey) {
  auto unknown = table_error("[ps.tables.emb]\ndim = 8\noptimizer = \"adamw\"\n");
  EXPECT_EQ(unknown.key, "ps.tables.emb.optimizer");
  EXPECT_EQ(unknown.line, 3);
  EXPECT_THAT(unknown.what, HasSubstr("job.toml:3"));
  EXPECT_THAT(unknown.what, HasSubstr("unknown optimizer \"adamw\"; use one of \"sgd\", \"adagrad\", \"adam\""));

  auto zero = table_error("[ps.tables.emb]\nkind = \"sparse\"\ndim = 0\n");
  EXPECT_EQ(zero.key, "ps.tables.emb.dim");
  EXPECT_EQ(zero.line, 3);
  EXPECT_THAT(zero.what, HasSubstr("must be in 1.."));

  auto missing_dim = table_error("[ps.tables.emb]\nkind = \"sparse\"\n");
  EXPECT_EQ(missing_dim.key, "ps.tables.emb.dim");
  EXPECT_THAT(missing_dim.what, HasSubstr("is required"));
  EXPECT_EQ(missing_dim.line, 1) << "points at the table when the key is absent";

  auto prob = table_error("[ps.tables.emb]\ndim = 4\n\nadmit_probability = 1.5\n");
  EXPECT_EQ(prob.key, "ps.tables.emb.admit_probability");
  EXPECT_EQ(prob.line, 4);
  EXPECT_THAT(prob.what, HasSubstr("must be in [0, 1]"));

  auto typo = table_error("[ps.tables.emb]\ndim = 4\nlearning_rat = 0.1\n");
  EXPECT_EQ(typo.line, 3);
  EXPECT_THAT(typo.what,
              HasSubstr("unknown key 'ps.tables.emb.learning_rat'; did you mean 'ps.tables.emb.learning_rate'?"));

  auto kind = table_error("[ps.tables.emb]\nkind = \"matrix\"\ndim = 4\n");
  EXPECT_EQ(kind.key, "ps.tables.emb.kind");
  EXPECT_THAT(kind.what, HasSubstr("unknown kind \"matrix\"; use one of \"sparse\", \"dense\""));

  auto uniform = table_error("[ps.tables.emb]\ndim = 4\ninitializer = \"uniform\"\ninit_a = 1.0\ninit_b = 0.5\n");
  EXPECT_EQ(uniform.key, "ps.tables.emb.init_b");
  EXPECT_EQ(uniform.line, 5);
  EXPECT_THAT(uniform.what, HasSubstr("init_b > init_a"));

  auto lr = table_error("[ps.tables.emb]\ndim = 4\nlearning_rate = -0.1\n");
  EXPECT_EQ(lr.key, "ps.tables.emb.learning_rate");
  EXPECT_THAT(lr.what, HasSubstr("must be > 0"));

  auto dense_only = table_error("[ps.tables.w]\nkind = \"dense\"\ndim = 4\ndecay_rate = 0.5\n", "w");
  EXPECT_EQ(dense_only.key, "ps.tables.w.decay_rate");
  EXPECT_EQ(dense_only.line, 4);
  EXPECT_THAT(dense_only.what, HasSubstr("applies to sparse tables only"));

  auto type = table_error("[ps.tables.emb]\ndim = \"8\"\n");
  EXPECT_THAT(type.what, HasSubstr("ps.tables.emb.dim"));
  EXPECT_THAT(type.what, HasSubstr("must be int"));
}

TEST(PsTableConfig, MissingTableListsTheDeclaredOnes) {
  auto absent = table_error("[ps.tables.emb]\ndim = 4\n[ps.tables.w]\nkind = \"dense\"\ndim = 2\n", "embedding");
  EXPECT_EQ(absent.key, "ps.tables.embedding");
  EXPECT_THAT(absent.what, HasSubstr("the job file has no [ps.tables.embedding] table (tables: emb, w)"));
  Config c = job("");
  EXPECT_THROW(TableConfig::from_config(c, "emb"), ConfigError);
  EXPECT_THROW(TableConfig::from_config(c, "bad name"), InvalidUsage);
}

TEST(PsKeys, SchemaChecksThePsTable) {
  Config ok =
      job("[ps]\nbackend = \"ps_grpc\"\ncollective = \"\"\ntimeout_s = 5\ncheckpoint_dir = \"/tmp/x\"\n"
          "save_on_exit = true\n[ps.tables.emb]\ndim = 4\n");
  EXPECT_EQ(ok.get_string("ps.collective", "gloo"), "");
  try {
    job("[ps]\ntimeout = 5\n");
    FAIL() << "an unknown [ps] key passed";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown key 'ps.timeout'"));
    EXPECT_THAT(e.what(), HasSubstr("ps.timeout_s"));
  }
  EXPECT_THROW(job("[ps]\nsave_on_exit = \"yes\"\n"), ConfigError);
}
