#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/data.h"

namespace dtrain::apps {

// Segmentation data sets: Datasets whose get() fills Image::mask (one class
// id per pixel, ignore_index where there is none) and sets *label to -1.
// BatchLoader turns them into int64 [B, H, W] label batches and augments image
// and mask alike (common/data.h). get() runs on the loader's background thread.

// Scenes composed from an item data set (Fashion-MNIST): on a size x size RGB
// canvas with a textured background (random dark colour, stripes, noise),
// between min_items and max_items items, each scaled by a factor in
// [min_scale, max_scale] of its 28 px, optionally mirrored, tinted with a
// random bright colour (every covered pixel at half its tint or more, so
// faint ones stand out from the dark background) and placed at a random position (a placement whose box overlaps the
// earlier items' boxes by more than max_overlap of its own is retried, so
// items overlap but stay visible). An item covers the pixels where its resized
// grey value exceeds `threshold`; a pixel's label is 1 + the class of the
// topmost item covering it, or 0 (background). Scene i is a pure function of
// (seed, i): every worker and every epoch composes the same scene i.
struct SceneOptions {
  size_t count = 1000;
  int size = 64;
  int min_items = 2, max_items = 3;
  double min_scale = 0.9, max_scale = 1.3;
  double max_overlap = 0.3;
  int threshold = 12;
  uint64_t seed = 0;
};
// num_classes() is items->num_classes() + 1; InvalidUsage for bad options.
std::shared_ptr<Dataset> make_scene_dataset(std::shared_ptr<Dataset> items, const SceneOptions& options);

// A PaddleSeg list file: one "image_path label_path" per line (blank lines and
// '#' comments skipped), paths relative to root. Images are decoded with
// OpenCV (channels 1 or 3) and resized to size x size (bilinear; size 0
// keeps each image's own size, for a Transforms pipeline); label images (8-bit
// grey or palette PNG, common/pictures.h) are resized with nearest neighbour. Errors name the list file and line (a
// malformed line, a missing image or label file: checked while loading the list); a label value that is neither in [0,
// num_classes) nor ignore_index names the label file, the value and the pixel (checked when the sample is loaded).
std::shared_ptr<Dataset> load_seg_list_dataset(const std::string& list_file, const std::string& root, int num_classes,
                                               int ignore_index, int size, int channels, size_t limit = 0);

}  // namespace dtrain::apps
