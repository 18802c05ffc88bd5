#pragma once

#include <string>
#include <vector>

#include "dtrain/config.h"

namespace dtrain::apps {

// The classification app's own job-file keys (besides [job], [communicator],
// [plugins], [role], [strategy] and the trainer's [train], [eval],
// [checkpoint], [log], [debug] from common/trainer.h):
//
//   [data]       dataset = "fashion-mnist" | "list"; dir (IDX folder); train_list,
//                val_list, root, image_size, channels, num_classes (list files);
//                limit_train, limit_eval (0: all; for short runs); prefetch
//   [augment]    crop_padding, flip, mean, std
//   [model]      name (resnet20/32/56/18/50), width (channel multiplier)
void add_cls_keys(ConfigSchema& schema);

// Loads the job file with its overrides and validates it against the full
// schema (job + strategy + trainer + cls keys). `checkpoint.resume = true` is
// accepted as well as a path.
Config load_cls_config(const std::string& path, const std::vector<std::string>& overrides);

// Everything `dtrain-cls JOB.toml [-o k=v]...` does: load and validate the job
// file, join the job, train, evaluate (top-1/top-5), checkpoint. Returns the
// exit code; errors are printed as one clear line and give 1.
int cls_main(int argc, char** argv);

}  // namespace dtrain::apps
