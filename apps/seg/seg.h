#pragma once

#include <string>
#include <vector>

#include "dtrain/config.h"

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

// Loads the job file with its overrides and validates it against the full schema.
Config load_seg_config(const std::string& path, const std::vector<std::string>& overrides);

// `dtrain-seg JOB.toml [-o k=v]...` trains; `dtrain-seg predict JOB.toml
// IMAGE... --output DIR [--checkpoint PATH]` writes each image's predicted
// mask as a palette PNG (the eval transforms and eval.is_slide apply); `dtrain-seg export JOB.toml --output DIR` writes
// composed scenes as a PaddleSeg data set (images/, labels/, list.txt).
// Returns the exit code; errors are printed as one clear line and give 1.
int seg_main(int argc, char** argv);

}  // namespace dtrain::apps
