// Every app's job-file keys and the trainer's are one schema: a key has one
// declaration, so an app and the trainer cannot give the same key two
// defaults, and a job file that leaves a key out gets that one default.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cls/cls.h"
#include "common/trainer.h"
#include "ctr/ctr.h"
#include "dtrain/error.h"
#include "dtrain/job.h"
#include "dtrain/strategy.h"
#include "ocr/ocr.h"
#include "seg/seg.h"

namespace dtrain::apps {
namespace app_keys_test {

struct App {
  const char* name;
  void (*add_keys)(ConfigSchema&);
};

const App kApps[] = {{"cls", add_cls_keys}, {"ctr", add_ctr_keys}, {"seg", add_seg_keys}, {"ocr", add_ocr_keys}};

ConfigSchema full_schema(const App& app) {
  ConfigSchema s;
  add_job_keys(s);
  add_strategy_keys(s);
  add_trainer_keys(s, std::string("output/") + app.name);
  app.add_keys(s);
  return s;
}

std::string write_job(const std::string& text) {
  auto path = std::filesystem::temp_directory_path() / ("dtrain_app_keys_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(path) << text;
  return path.string();
}

TEST(AppKeys, EveryAppSchemaDeclaresEachKeyOnce) {
  for (const App& app : kApps) {
    SCOPED_TRACE(app.name);
    ConfigSchema s;
    EXPECT_NO_THROW(s = full_schema(app));
    ConfigSchema trainer;
    add_trainer_keys(trainer, "out");
    // Restating any trainer key in the app's table is refused, whatever the default.
    for (const ConfigKey& k : trainer.keys()) EXPECT_THROW(s.add(k.path, k.type, k.default_text), InvalidUsage);
  }
}

TEST(AppKeys, AnAbsentKeyGetsTheTrainersOneDefaultInEveryApp) {
  ConfigSchema trainer;
  add_trainer_keys(trainer, "out");
  const std::string job = write_job("[job]\nprogram = \"x\"\n");
  for (const App& app : kApps) {
    SCOPED_TRACE(app.name);
    Config c = load_job_config(job, {}, app.add_keys, "out");
    for (const char* key : {"train.batch_size", "train.epochs", "log.every_steps", "data.prefetch"})
      EXPECT_EQ(c.get_int(key), std::stoll(trainer.find(key)->default_text)) << key;
    EXPECT_EQ(c.get_string("job.backend"), "gloo");
  }
  std::filesystem::remove(job);
}

TEST(AppKeys, TheShippedJobFilesValidate) {
  for (const App& app : kApps) {
    SCOPED_TRACE(app.name);
    const std::string path = std::string(DTRAIN_SOURCE_DIR) + "/apps/" + app.name + ".toml";
    EXPECT_NO_THROW(load_job_config(path, {}, app.add_keys, "out"));
  }
}

// [train] threads sizes libtorch's pool and OpenBLAS's (Debian's libtorch
// multiplies matrices with OpenBLAS's pthreads build, whose idle threads spin).
TEST(WorkerThreads, SetWorkerThreadsSizesLibtorchAndOpenBlas) {
  using GetThreads = int (*)();
  auto openblas_threads = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  ASSERT_NE(openblas_threads, nullptr) << "this libtorch does not multiply with OpenBLAS";
  for (int n : {2, 1}) {
    set_worker_threads(n);
    EXPECT_EQ(torch::get_num_threads(), n);
    EXPECT_EQ(openblas_threads(), n);
  }
}

}  // namespace app_keys_test
}  // namespace dtrain::apps
