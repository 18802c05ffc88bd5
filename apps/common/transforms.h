#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/data.h"
#include "dtrain/config.h"

namespace dtrain::apps {

// Per-split data pipelines written in the job file with PaddleClas's and
// PaddleSeg's operator names and parameters. A pipeline is a table whose keys
// are the operators, applied in the order they are written (as the YAML
// `transform_ops` / `transforms` lists), each with its parameters inline:
//
//   [data.train.transforms]                               # cls (PaddleClas)
//   DecodeImage = { to_rgb = true }
//   RandCropImage = { size = 224, scale = [0.08, 1.0], ratio = [0.75, 1.3333333] }
//   RandFlipImage = { flip_code = 1 }
//   NormalizeImage = { scale = "1.0/255.0", mean = [0.485, 0.456, 0.406], std = [0.229, 0.224, 0.225] }
//
//   [data.train.transforms]                               # seg (PaddleSeg)
//   ResizeStepScaling = { min_scale_factor = 0.5, max_scale_factor = 2.0, scale_step_size = 0.25 }
//   RandomPaddingCrop = { crop_size = [512, 256] }
//   RandomHorizontalFlip = {}
//   Normalize = { mean = [0.5, 0.5, 0.5], std = [0.5, 0.5, 0.5] }
//
// cls operators: DecodeImage {to_rgb, channel_first} (decoding is the data
// set's: grey or RGB by data.channels; accepted for PaddleClas files),
// RandCropImage {size, scale = [0.08, 1], ratio = [3/4, 4/3]} (random-resized
// crop, PaddleClas's arithmetic, then a bilinear resize to size),
// ResizeImage {resize_short | size} (bilinear), CropImage {size} (centre
// crop), RandFlipImage {flip_code = 1: horizontal, 0: vertical, -1: both;
// half the samples}, NormalizeImage {scale = 1/255, mean, std (1 or C values),
// order}, ToCHWImage {} (layout is always CHW: accepted, does nothing).
// seg operators: ResizeStepScaling {min_scale_factor = 0.75, max_scale_factor
// = 1.25, scale_step_size = 0.25}, RandomPaddingCrop {crop_size = [512, 512]
// (w, h), im_padding_value = 127.5 (rounded), label_padding_value = 255}
// (bottom/right padding to the crop, then a random crop), Resize {target_size
// = [512, 512]}, RandomHorizontalFlip {prob = 0.5}, RandomVerticalFlip {prob
// = 0.1}, Normalize {mean = [0.5]*3, std = [0.5]*3: (x / 255 - mean) / std}.
// A size is an integer (square) or [w, h]. Images take bilinear resizing,
// label masks nearest neighbour. Without a normalize operator the output is
// pixels / 255. `interpolation` (cls) and `interp` (seg) accept only
// bilinear ("bilinear", "LINEAR"). An unknown operator, an unknown or mistyped parameter, or a
// bad value is a ConfigError at its file:line naming the key.
class Transforms {
 public:
  enum class Flavour { Cls, Seg };

  // The pipeline at `path` (e.g. "data.train.transforms"), or null when the
  // job has no such table.
  static std::shared_ptr<const Transforms> from_config(const Config& config, const std::string& path, Flavour flavour);

  // A sample after the pipeline: float CHW pixels, and the mask (HW) for segmentation.
  struct Output {
    int channels = 0, height = 0, width = 0;
    std::vector<float> pixels;
    std::vector<uint8_t> mask;
  };
  // Runs the operators on `image`; every random choice comes from `seed`
  // (the same seed, the same output). InvalidUsage when the image does not
  // fit an operator (a centre crop larger than the image, mean of 3 values
  // for a grey image), naming the operator.
  Output apply(const Image& image, uint64_t seed) const;

  // The final normalisation, out = (pixel * scale() - mean[c]) / std[c]
  // (pictures and exports undo or describe it); mean and std have 1 or C values.
  double scale() const { return scale_; }
  const std::vector<double>& mean() const { return mean_; }
  const std::vector<double>& stddev() const { return std_; }
  // "RandCropImage(size 224x224 scale [0.08, 1] ratio [0.75, 1.333]) -> ..."
  std::string describe() const;
  // ConfigError at the normalize operator (or at the pipeline's key) when
  // its mean or std has neither 1 nor `channels` values.
  void check_channels(const Config& config, int channels) const;

  struct Op;  // one operator with its parameters (transforms.cc)
  ~Transforms();
  Transforms();

 private:
  std::vector<Op> ops_;
  std::string path_, normalize_key_;
  double scale_ = 1.0 / 255.0;
  std::vector<double> mean_{0.0}, std_{1.0};
};

// An app's [data.train.transforms] and [data.eval.transforms] into
// augment.train_transforms / eval_transforms: both or neither (ConfigError at
// the one given alone), their normalization checked against `channels`.
void read_transforms(const Config& config, Transforms::Flavour flavour, int channels, AugmentOptions& augment);

// Image resizing on CHW uint8 planes: bilinear with half-pixel centres (as
// OpenCV's INTER_LINEAR) for pixels, nearest (OpenCV's INTER_NEAREST) for
// label masks. Exposed for the tests.
std::vector<uint8_t> resize_bilinear(const std::vector<uint8_t>& src, int channels, int h, int w, int out_h, int out_w);
std::vector<uint8_t> resize_nearest(const std::vector<uint8_t>& src, int channels, int h, int w, int out_h, int out_w);

}  // namespace dtrain::apps
