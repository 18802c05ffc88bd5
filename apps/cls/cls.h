#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/config.h"
#include "dtrain/config_table.h"

namespace dtrain::apps {

// The classification app's own job-file keys (besides [job], [communicator],
// [plugins], [role], [strategy] and the trainer's [train], [eval],
// [checkpoint], [log], [debug] from common/trainer.h):
//
//   [data]       dataset = "fashion-mnist" | "list"; dir (IDX folder); train_list,
//                val_list, root, image_size, channels, num_classes (list files);
//                limit_train, limit_eval (0: all; for short runs); prefetch, num_workers
//                (loader threads)
//   [data.train.transforms], [data.eval.transforms]
//                PaddleClas operators in order (common/transforms.h): DecodeImage,
//                RandCropImage, ResizeImage, CropImage, RandFlipImage, NormalizeImage,
//                ToCHWImage; given, they replace [augment] and image_size (list
//                images keep their own size until the operators crop them)
//   [augment]    crop_padding, flip, mean, std (without transforms)
//   [model]      name (resnet20/32/56/18/50), width (channel multiplier)
void add_cls_keys(ConfigSchema& schema);

// The classification app's own keys above ([data], [augment], [model]) with
// their defaults; cls_table() declares and reads them.
struct ClsOptions {
  std::string dataset = "fashion-mnist";
  std::string dir = "/usr/share/datasets/fashion-mnist";
  std::string train_list, val_list, root;
  int64_t image_size = 32, channels = 3, num_classes = 10;
  int64_t limit_train = 0, limit_eval = 0;
  int64_t crop_padding = 2;
  bool flip = true;
  double mean = 0.286, std = 0.353;
  std::string model = "resnet20";
  double width = 1.0;
};
const ConfigTable<ClsOptions>& cls_table();

// Loads the job file with its overrides and validates it against the full
// schema (job + strategy + trainer + cls keys). `checkpoint.resume = true` is
// accepted as well as a path.
Config load_cls_config(const std::string& path, const std::vector<std::string>& overrides);

// Everything `dtrain-cls JOB.toml [-o k=v]...` does: load and validate the job
// file, join the job, train, evaluate (top-1/top-5), checkpoint. Returns the
// exit code; errors are printed as one clear line and give 1. Also
// `dtrain-cls export_model` and `dtrain-cls loader_bench JOB [-o k=v]...
// [--batches N]` (the loader's images/s alone, common/trainer.h).
int cls_main(int argc, char** argv);

}  // namespace dtrain::apps
