#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/config.h"
#include "dtrain/config_table.h"

namespace dtrain::apps {

// The CTR app's own job-file keys (besides [job], [strategy], [ps],
// [ps.tables.*] and the trainer's [train], [eval], [checkpoint], [log]):
//
//   [data]   format = "criteo" | "slot"; train_files, test_files (lists);
//            generate (write click logs from a teacher model into dir when
//            train_files are missing), dir, gen_train_lines, gen_test_lines,
//            gen_seed; on_error = "skip" | "fail" (malformed lines);
//            limit_train, limit_test (0: all); prefetch
//   [model]  embedding_dim, hidden (MLP sizes), interaction = "dot" | "none"
//   [train]  loss_reduction = "auto" | "sum" | "mean" (what a worker pushes);
//            geo_sparse_lr, geo_dense_lr (GEO's local SGD rates)
//   [debug]  sleep_ms (after every step; tests), kill_at_step
//
// Tables: [ps.tables.wide] (sparse, dim 1), [ps.tables.deep] (sparse, dim =
// model.embedding_dim), [ps.tables.dense] (the MLP and the wide part's dense
// weights, one dense table per parameter).
void add_ctr_keys(ConfigSchema& schema);

// The CTR app's own keys above with their defaults; ctr_table() declares and
// reads them (the trainer's through trainer_table(), common/trainer.h).
struct CtrOptions {
  std::string format = "criteo";
  std::vector<std::string> train_files, test_files;
  bool generate = true;
  std::string dir = "output/ctr/data";
  int64_t gen_train_lines = 400000, gen_test_lines = 50000, gen_seed = 1;
  std::string on_error = "skip";
  int64_t limit_train = 0, limit_test = 0;
  int64_t embedding_dim = 8;
  std::vector<int64_t> hidden{64, 32};
  std::string interaction = "none";
  double geo_sparse_lr = 2.0, geo_dense_lr = 0.1;
  int64_t sleep_ms = 0;
  std::string loss_reduction = "auto";
};
const ConfigTable<CtrOptions>& ctr_table();

// `dtrain-ctr JOB.toml [-o k=v]...` (train: a server or a worker, as the
// role says), `dtrain-ctr gen --dir D ...`, `dtrain-ctr predict JOB.toml
// --model DIR --input FILE --output FILE`. Returns the exit code.
int ctr_main(int argc, char** argv);

}  // namespace dtrain::apps
