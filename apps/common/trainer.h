#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dtrain/config.h"
#include "dtrain/job.h"
#include "dtrain/strategy.h"

namespace dtrain::apps {

// The classification trainer's job-file keys (besides [job], [communicator],
// [plugins], [role] from add_job_keys and [strategy] from add_strategy_keys):
//
//   [data]       dataset = "fashion-mnist" | "list"; dir (IDX folder); train_list,
//                val_list, root, image_size, channels, num_classes (list files);
//                limit_train, limit_eval (0: all; for short runs); prefetch
//   [augment]    crop_padding, flip, mean, std
//   [model]      name (resnet20/32/56/18/50), width (channel multiplier)
//   [train]      epochs, batch_size (per worker), eval_batch_size, lr, momentum,
//                weight_decay, warmup_epochs, schedule ("cosine" | "piecewise"),
//                milestones (epochs), gamma, seed, threads (intra-op), max_steps
//   [eval]       every_epochs (0: only at the end)
//   [checkpoint] dir, every_epochs, every_steps, resume (false | true | "path")
//   [log]        every_steps, tensorboard ("" or a folder)
//   [debug]      dump_params ("" or a path; "{rank}" is replaced), kill_at_step
void add_cls_keys(ConfigSchema& schema);

// Everything `dtrain-cls JOB.toml [-o k=v]...` does: load and validate the job
// file, join the job, train, evaluate, checkpoint. Returns the exit code;
// errors are printed as one clear line and give 1.
int cls_main(int argc, char** argv);

// Loads the job file with its overrides and validates it against the full
// schema (job + strategy + cls keys). `checkpoint.resume = true` is accepted
// as well as a path.
Config load_cls_config(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace dtrain::apps
