#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/prefetch.h"

namespace dtrain::apps {

// One decoded image: channels x height x width, uint8, channel-major. A
// segmentation sample also carries its per-pixel labels (height x width,
// row-major; AugmentOptions::ignore_index marks pixels without a label); a
// text-recognition sample its label as character ids (1.., 0 is CTC's blank).
struct Image {
  int channels = 0, height = 0, width = 0;
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> mask;  // empty for classification
  std::vector<int64_t> text;  // empty unless text recognition
};

// A labelled image set. get() and get_train() must be safe to call from the
// loader's threads at once (data.num_workers of them) while the owner does
// nothing else with the dataset.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual size_t size() const = 0;
  virtual int channels() const = 0;
  virtual int num_classes() const = 0;
  virtual Image get(size_t index, int64_t* label) const = 0;
  // The sample as training sees it in `epoch`, for data sets that synthesise
  // or augment their samples themselves (a pure function of its arguments);
  // by default get(index, label). Called on the loader thread.
  virtual Image get_train(size_t index, uint64_t seed, int64_t epoch, int64_t* label) const {
    (void)seed;
    (void)epoch;
    return get(index, label);
  }
};

// Reads a list file (PaddleClas, PaddleSeg): f(entry, line) for each entry
// line, '\r' and the blanks around it removed; blank lines and lines starting
// with '#' skipped. f returns false to stop. IoError when it cannot be opened.
void read_list_file(const std::string& list_file, const std::function<bool(const std::string&, int)>& f);

// Images named in a list file: the file (for messages), the classes, the
// side its images are resized to (0: kept as they are) and their channels.
class ListFileDataset : public Dataset {
 public:
  ListFileDataset(std::string list_file, int classes, int size, int channels)
      : list_file_(std::move(list_file)), classes_(classes), size_(size), channels_(channels) {}
  int channels() const override { return channels_; }
  int num_classes() const override { return classes_; }

 protected:
  // " (<list file>:<line>)": where an entry's error points.
  std::string where(int line) const { return " (" + list_file_ + ":" + std::to_string(line) + ")"; }

  std::string list_file_;
  int classes_, size_, channels_;
};

// Fashion-MNIST (or MNIST) from its IDX files, gzip-compressed or not:
// <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]. Errors name the file
// (missing, truncated, bad magic, counts that disagree). limit > 0 keeps the
// first `limit` images.
std::shared_ptr<Dataset> load_idx_dataset(const std::string& dir, bool train, size_t limit = 0);

// A PaddleClas list file: one "relative/path.jpg label" per line (blank lines
// and lines starting with '#' skipped), paths relative to root. Images are
// decoded with OpenCV when fetched (channels 1 or 3) and resized to size x size;
// size 0 keeps each image's own size (for a Transforms pipeline to crop).
// Parsing errors name the list file and line; a label outside [0, num_classes)
// names the line; a missing image names the path and the list line that
// referred to it (checked while loading the list).
// Built without OpenCV (DTRAIN_APPS_OPENCV=OFF) it throws InvalidUsage with
// list_datasets_unavailable()'s text.
std::shared_ptr<Dataset> load_list_dataset(const std::string& list_file, const std::string& root, int num_classes,
                                           int size, int channels, size_t limit = 0);

// Empty where list data sets can be read; otherwise why not (no OpenCV in
// this build) and the fix, for the apps to refuse `data.dataset = "list"`
// at the key before loading anything.
std::string list_datasets_unavailable();

// Each rank's share of an epoch, as PyTorch's DistributedSampler: the indices
// are shuffled with a generator seeded by (seed, epoch), padded to a multiple
// of world by repeating the first ones, and rank r takes every world-th from r.
// Every rank gets the same count and the shards are disjoint (up to the padding).
// With an offset, the epoch's first `offset` positions (consumed at another
// world size) are left out and the rest is split among this world.
std::vector<size_t> shard_indices(size_t dataset_size, int rank, int world, uint64_t seed, int64_t epoch, bool shuffle,
                                  int64_t offset = 0);

// Training-time augmentation. For a sample with a mask (segmentation) the
// image and its labels take the same geometric transform: a random scale in
// [min_scale, max_scale] (bilinear for the image, nearest for the labels),
// a random crop back to the sample's size (plus the crop_padding jitter;
// pixels from outside the source are 0 in the image and ignore_index in the
// labels) and the flip. Classification samples use crop_padding and flip only.
// A Transforms pipeline (common/transforms.h) for the split replaces all of
// this: the loader runs it on each sample and batches its output.
class Transforms;
struct AugmentOptions {
  int crop_padding = 0;  // random crop after zero padding on every side (0: none)
  bool flip = false;     // random horizontal flip
  float mean = 0.0f, std = 1.0f;
  float min_scale = 1.0f, max_scale = 1.0f;                             // segmentation only
  int ignore_index = 255;                                               // segmentation only
  std::shared_ptr<const Transforms> train_transforms, eval_transforms;  // null: the options above
};

// A batch ready for the model.
struct Batch {
  torch::Tensor images;         // float32 [B, C, H, W], normalised
  torch::Tensor labels;         // int64 [B]; segmentation: int64 [B, H, W]; text: int64 [B, longest], 0-padded
  torch::Tensor label_lengths;  // text: int64 [B], each sample's label length; undefined otherwise
  int64_t index = 0;            // batch number within the epoch
};

// Produces the batches of one epoch on `num_workers` background threads (each
// makes whole batches: decoding and transforms in parallel), `prefetch`
// batches ahead, handed out in order. Training batches come from
// Dataset::get_train, evaluation batches from Dataset::get. Augmentation
// randomness is a pure function of (seed, epoch, sample index), so a resumed
// run sees exactly the batches it would have seen, and any num_workers gives
// the same batches. The samples of a batch must come out of the pipeline with
// one shape (InvalidUsage naming the item otherwise).
class BatchLoader {
 public:
  BatchLoader(std::shared_ptr<Dataset> dataset, std::vector<size_t> indices, int64_t batch_size, bool drop_last,
              AugmentOptions augment, bool train, uint64_t seed, int64_t epoch, int64_t first_batch = 0,
              int prefetch = 4, int num_workers = 1);
  ~BatchLoader();
  int64_t num_batches() const { return num_batches_; }
  // False once the epoch is exhausted. Rethrows a loading error.
  bool next(Batch* out);
  // Seconds the consumer spent waiting for data.
  double wait_seconds() const { return prefetch_->wait_seconds(); }

 private:
  Batch make_batch(int64_t b) const;
  Batch make_text_batch(int64_t b, Image first) const;
  Batch make_transformed_batch(int64_t b, const Transforms& ops) const;
  uint64_t sample_seed(size_t idx) const;
  void fill_segmentation(const Image& im, size_t idx, float* image, int64_t* labels) const;

  std::shared_ptr<Dataset> dataset_;
  std::vector<size_t> indices_;
  int64_t batch_size_;
  int64_t num_batches_;
  AugmentOptions augment_;
  bool train_;
  uint64_t seed_;
  int64_t epoch_;
  std::unique_ptr<OrderedPrefetcher<Batch>> prefetch_;  // last: its threads use the members above
};

}  // namespace dtrain::apps
