#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/config.h"
#include "dtrain/config_table.h"

namespace dtrain::apps {

// The segmentation app's own job-file keys (besides [job], [communicator],
// [plugins], [role], [strategy] and the trainer's [train], [eval],
// [checkpoint], [log], [debug] from common/trainer.h):
//
//   [data]     dataset = "scenes" | "list"; dir (Fashion-MNIST IDX folder),
//              train_scenes, eval_scenes, scene_size, min_items, max_items,
//              min_item_scale, max_item_scale, max_overlap, item_threshold (scenes);
//              train_list, val_list, root, image_size, channels, num_classes
//              (PaddleSeg lists); ignore_index; limit_train, limit_eval; prefetch,
//              num_workers (loader threads)
//   [data.train.transforms], [data.eval.transforms]
//              PaddleSeg operators in order (common/transforms.h): ResizeStepScaling,
//              RandomPaddingCrop, Resize, RandomHorizontalFlip, RandomVerticalFlip,
//              Normalize; given, they replace [augment] and image_size (list images
//              keep their own size, e.g. 2:1, until the operators scale and crop them)
//   [augment]  min_scale, max_scale, crop_padding, flip, mean, std (without transforms)
//   [model]    name (unet | liteseg), width (base channels), depth (unet stages)
//   [loss]     dice_weight (0: cross-entropy only)
//   [eval]     pictures (strips written per evaluation), picture_dir, flip, scales (test-time
//              augmentation: mirror and resized copies averaged); is_slide, crop_size,
//              stride (PaddleSeg's test_config: sliding windows at full resolution,
//              overlapping logits averaged; also used by predict)
void add_seg_keys(ConfigSchema& schema);

// The segmentation app's own keys above with their defaults; seg_table()
// declares and reads them.
struct SegOptions {
  std::string dataset = "scenes";
  std::string dir = "/usr/share/datasets/fashion-mnist";
  int64_t train_scenes = 4000, eval_scenes = 500, scene_size = 64;
  int64_t min_items = 2, max_items = 3, train_min_items = -1, train_max_items = -1;
  double min_item_scale = 0.9, max_item_scale = 1.3, max_overlap = 0.3;
  int64_t item_threshold = 12;
  std::string train_list, val_list, root;
  int64_t image_size = 64, channels = 3, num_classes = 11, ignore_index = 255;
  int64_t limit_train = 0, limit_eval = 0;
  double min_scale = 0.8, max_scale = 1.25;
  int64_t crop_padding = 4;
  bool flip = true;
  double mean = 0.4, std = 0.25;
  std::string model = "unet";
  int64_t width = 16, depth = 3;
  double dice_weight = 0;
  int64_t pictures = 4;
  std::string picture_dir;
  bool eval_flip = false;
  std::vector<double> scales{1.0};
  bool is_slide = false;
  std::vector<int64_t> crop_size, stride;
};
const ConfigTable<SegOptions>& seg_table();

// Loads the job file with its overrides and validates it against the full schema.
Config load_seg_config(const std::string& path, const std::vector<std::string>& overrides);

// `dtrain-seg JOB.toml [-o k=v]...` trains; `dtrain-seg predict JOB.toml
// IMAGE... --output DIR [--checkpoint PATH]` writes each image's predicted
// mask as a palette PNG (the eval transforms and eval.is_slide apply); `dtrain-seg export JOB.toml --output DIR` writes
// composed scenes as a PaddleSeg data set (images/, labels/, list.txt).
// Returns the exit code; errors are printed as one clear line and give 1.
int seg_main(int argc, char** argv);

}  // namespace dtrain::apps
