#include "common/data.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include <zlib.h>

#include "common/transforms.h"
#include "dtrain/error.h"
#include "dtrain/sdk/random.h"

namespace fs = std::filesystem;

namespace dtrain::apps {

namespace {

std::vector<uint8_t> read_maybe_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw IoError("cannot open data file '" + path + "': " + std::strerror(errno));
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  while (true) {
    int n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      throw IoError("cannot read data file '" + path + "': " + msg);
    }
    if (n == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  }
  gzclose(f);
  return out;
}

uint32_t be32(const std::vector<uint8_t>& b, size_t off) {
  return (uint32_t(b[off]) << 24) | (uint32_t(b[off + 1]) << 16) | (uint32_t(b[off + 2]) << 8) | b[off + 3];
}

std::string find_idx(const std::string& dir, const std::string& stem) {
  for (const char* ext : {".gz", ""}) {
    fs::path p = fs::path(dir) / (stem + ext);
    if (fs::exists(p)) return p.string();
  }
  throw IoError("missing data file '" + (fs::path(dir) / (stem + ".gz")).string() +
                "' (nor without .gz); install dataset-fashion-mnist or set data.dir");
}

class InMemoryDataset : public Dataset {
 public:
  InMemoryDataset(int c, int h, int w, int classes, std::vector<uint8_t> pixels, std::vector<int64_t> labels)
      : c_(c), h_(h), w_(w), classes_(classes), pixels_(std::move(pixels)), labels_(std::move(labels)) {}
  size_t size() const override { return labels_.size(); }
  int channels() const override { return c_; }
  int num_classes() const override { return classes_; }
  Image get(size_t i, int64_t* label) const override {
    Image im{c_, h_, w_, {}, {}, {}};
    size_t n = size_t(c_) * h_ * w_;
    im.pixels.assign(pixels_.begin() + i * n, pixels_.begin() + (i + 1) * n);
    *label = labels_[i];
    return im;
  }

 private:
  int c_, h_, w_, classes_;
  std::vector<uint8_t> pixels_;
  std::vector<int64_t> labels_;
};

}  // namespace

std::shared_ptr<Dataset> load_idx_dataset(const std::string& dir, bool train, size_t limit) {
  std::string prefix = train ? "train" : "t10k";
  std::string ipath = find_idx(dir, prefix + "-images-idx3-ubyte");
  std::string lpath = find_idx(dir, prefix + "-labels-idx1-ubyte");
  auto images = read_maybe_gzip(ipath);
  auto labels = read_maybe_gzip(lpath);
  if (images.size() < 16 || be32(images, 0) != 0x803)
    throw IoError("data file '" + ipath + "' is not an IDX image file (bad magic or truncated header)");
  if (labels.size() < 8 || be32(labels, 0) != 0x801)
    throw IoError("data file '" + lpath + "' is not an IDX label file (bad magic or truncated header)");
  size_t n = be32(images, 4), h = be32(images, 8), w = be32(images, 12), nl = be32(labels, 4);
  if (n != nl)
    throw IoError("'" + ipath + "' has " + std::to_string(n) + " images but '" + lpath + "' has " + std::to_string(nl) +
                  " labels");
  if (images.size() < 16 + n * h * w) throw IoError("data file '" + ipath + "' is truncated");
  if (labels.size() < 8 + n) throw IoError("data file '" + lpath + "' is truncated");
  if (limit > 0 && limit < n) n = limit;
  std::vector<uint8_t> pixels(images.begin() + 16, images.begin() + 16 + n * h * w);
  std::vector<int64_t> lab(n);
  for (size_t i = 0; i < n; ++i) {
    lab[i] = labels[8 + i];
    if (lab[i] >= 10)
      throw IoError("data file '" + lpath + "': label " + std::to_string(lab[i]) + " of item " + std::to_string(i) +
                    " is outside [0, 10)");
  }
  return std::make_shared<InMemoryDataset>(1, int(h), int(w), 10, std::move(pixels), std::move(lab));
}

std::vector<size_t> shard_indices(size_t n, int rank, int world, uint64_t seed, int64_t epoch, bool shuffle,
                                  int64_t offset) {
  std::vector<size_t> all(n);
  std::iota(all.begin(), all.end(), size_t{0});
  if (shuffle) {
    std::mt19937_64 gen(sdk::splitmix64(seed ^ sdk::splitmix64(static_cast<uint64_t>(epoch))));
    for (size_t i = n; i > 1; --i) std::swap(all[i - 1], all[gen() % i]);
  }
  if (offset > 0) {
    all.erase(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(n, offset)));
    n = all.size();
    if (n == 0) return {};
  }
  size_t total = (n + world - 1) / world * world;
  for (size_t i = n; i < total; ++i) all.push_back(all[i - n]);
  std::vector<size_t> mine;
  for (size_t i = static_cast<size_t>(rank); i < total; i += static_cast<size_t>(world)) mine.push_back(all[i]);
  return mine;
}

BatchLoader::BatchLoader(std::shared_ptr<Dataset> dataset, std::vector<size_t> indices, int64_t batch_size,
                         bool drop_last, AugmentOptions augment, bool train, uint64_t seed, int64_t epoch,
                         int64_t first_batch, int prefetch, int num_workers)
    : dataset_(std::move(dataset)),
      indices_(std::move(indices)),
      batch_size_(batch_size),
      augment_(augment),
      train_(train),
      seed_(seed),
      epoch_(epoch) {
  int64_t n = static_cast<int64_t>(indices_.size());
  num_batches_ = drop_last ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
  const int workers = std::max(1, num_workers);
  prefetch_ = std::make_unique<OrderedPrefetcher<Batch>>(
      std::max<int64_t>(0, num_batches_ - first_batch), workers, static_cast<size_t>(std::max(1, prefetch) + workers),
      [this, first_batch](int64_t i) { return make_batch(first_batch + i); });
}

BatchLoader::~BatchLoader() = default;

uint64_t BatchLoader::sample_seed(size_t idx) const {
  return sdk::splitmix64(seed_ ^ sdk::splitmix64(static_cast<uint64_t>(epoch_) * 0x10001ULL + idx * 0x9E3779B1ULL + 7));
}

Batch BatchLoader::make_transformed_batch(int64_t b, const Transforms& ops) const {
  int64_t start = b * batch_size_;
  int64_t end = std::min<int64_t>(start + batch_size_, static_cast<int64_t>(indices_.size()));
  int64_t count = end - start;
  Batch out;
  out.index = b;
  int c = 0, h = 0, w = 0;
  bool dense = false;
  float* dst = nullptr;
  int64_t* lab = nullptr;
  for (int64_t k = 0; k < count; ++k) {
    size_t idx = indices_[start + k];
    int64_t label = 0;
    Image im = train_ ? dataset_->get_train(idx, seed_, epoch_, &label) : dataset_->get(idx, &label);
    Transforms::Output t = ops.apply(im, sample_seed(idx) ^ 0x5bd1e995ULL);
    if (k == 0) {
      c = t.channels, h = t.height, w = t.width;
      dense = !t.mask.empty();
      out.images = torch::empty({count, c, h, w}, torch::kFloat32);
      out.labels = dense ? torch::empty({count, h, w}, torch::kInt64) : torch::empty({count}, torch::kInt64);
      dst = out.images.data_ptr<float>();
      lab = out.labels.data_ptr<int64_t>();
    } else if (t.channels != c || t.height != h || t.width != w) {
      throw InvalidUsage("images of one batch differ in shape after the transforms: item " + std::to_string(idx) +
                         " is " + std::to_string(t.width) + "x" + std::to_string(t.height) + ", the batch's first " +
                         std::to_string(w) + "x" + std::to_string(h) +
                         " (crop or resize to one size, or use a batch size of 1)");
    }
    std::copy(t.pixels.begin(), t.pixels.end(), dst + k * c * h * w);
    if (dense)
      std::copy(t.mask.begin(), t.mask.end(), lab + k * h * w);
    else
      lab[k] = label;
  }
  return out;
}

Batch BatchLoader::make_batch(int64_t b) const {
  if (const auto& ops = train_ ? augment_.train_transforms : augment_.eval_transforms)
    return make_transformed_batch(b, *ops);
  int64_t start = b * batch_size_;
  int64_t end = std::min<int64_t>(start + batch_size_, static_cast<int64_t>(indices_.size()));
  int64_t count = end - start;
  int64_t label = 0;
  auto fetch = [&](size_t idx) {
    return train_ ? dataset_->get_train(idx, seed_, epoch_, &label) : dataset_->get(idx, &label);
  };
  Image first = fetch(indices_[start]);
  const int c = first.channels, h = first.height, w = first.width;
  Batch out;
  out.index = b;
  const bool dense = !first.mask.empty();
  if (!first.text.empty()) return make_text_batch(b, std::move(first));
  out.images = torch::empty({count, c, h, w}, torch::kFloat32);
  out.labels = dense ? torch::empty({count, h, w}, torch::kInt64) : torch::empty({count}, torch::kInt64);
  float* dst = out.images.data_ptr<float>();
  int64_t* lab = out.labels.data_ptr<int64_t>();
  const float scale = 1.0f / (255.0f * augment_.std), shift = augment_.mean / augment_.std;
  const int pad = train_ ? augment_.crop_padding : 0;
  for (int64_t k = 0; k < count; ++k) {
    size_t idx = indices_[start + k];
    Image im = k == 0 ? std::move(first) : fetch(idx);
    if (im.channels != c || im.height != h || im.width != w)
      throw InvalidUsage("images of one batch differ in shape (item " + std::to_string(idx) + ")");
    if (dense) {
      if (im.mask.size() != size_t(h) * w)
        throw InvalidUsage("item " + std::to_string(idx) + ": label mask does not match the image's size");
      fill_segmentation(im, idx, dst + k * c * h * w, lab + k * h * w);
      continue;
    }
    lab[k] = label;
    int dx = 0, dy = 0;
    bool flip = false;
    if (train_) {
      uint64_t r = sample_seed(idx);
      if (pad > 0) {
        dx = static_cast<int>(r % (2 * pad + 1)) - pad;
        dy = static_cast<int>((r >> 16) % (2 * pad + 1)) - pad;
      }
      flip = augment_.flip && ((r >> 40) & 1);
    }
    float* o = dst + k * c * h * w;
    for (int ch = 0; ch < c; ++ch)
      for (int y = 0; y < h; ++y) {
        int sy = y + dy;
        for (int x = 0; x < w; ++x) {
          int sx = (flip ? w - 1 - x : x) + dx;
          float v = (sy >= 0 && sy < h && sx >= 0 && sx < w) ? im.pixels[(size_t(ch) * h + sy) * w + sx] : 0.0f;
          o[(size_t(ch) * h + y) * w + x] = v * scale - shift;
        }
      }
  }
  return out;
}

Batch BatchLoader::make_text_batch(int64_t b, Image first) const {
  int64_t start = b * batch_size_;
  int64_t end = std::min<int64_t>(start + batch_size_, static_cast<int64_t>(indices_.size()));
  int64_t count = end - start;
  const int c = first.channels, h = first.height, w = first.width;
  std::vector<Image> items;
  items.reserve(size_t(count));
  items.push_back(std::move(first));
  int64_t label = 0;
  for (int64_t k = 1; k < count; ++k) {
    size_t idx = indices_[start + k];
    items.push_back(train_ ? dataset_->get_train(idx, seed_, epoch_, &label) : dataset_->get(idx, &label));
    const Image& im = items.back();
    if (im.channels != c || im.height != h || im.width != w)
      throw InvalidUsage("images of one batch differ in shape (item " + std::to_string(idx) + ")");
    if (im.text.empty()) throw InvalidUsage("item " + std::to_string(idx) + " of a text batch has an empty label");
  }
  size_t longest = 0;
  for (const auto& im : items) longest = std::max(longest, im.text.size());
  Batch out;
  out.index = b;
  out.images = torch::empty({count, c, h, w}, torch::kFloat32);
  out.labels = torch::zeros({count, int64_t(longest)}, torch::kInt64);
  out.label_lengths = torch::empty({count}, torch::kInt64);
  float* dst = out.images.data_ptr<float>();
  int64_t* lab = out.labels.data_ptr<int64_t>();
  int64_t* len = out.label_lengths.data_ptr<int64_t>();
  const float scale = 1.0f / (255.0f * augment_.std), shift = augment_.mean / augment_.std;
  for (int64_t k = 0; k < count; ++k) {
    const Image& im = items[size_t(k)];
    float* o = dst + k * c * h * w;
    for (size_t i = 0; i < im.pixels.size(); ++i) o[i] = im.pixels[i] * scale - shift;
    std::copy(im.text.begin(), im.text.end(), lab + k * int64_t(longest));
    len[k] = int64_t(im.text.size());
  }
  return out;
}

void BatchLoader::fill_segmentation(const Image& im, size_t idx, float* o, int64_t* lab) const {
  const int c = im.channels, h = im.height, w = im.width;
  const float scale = 1.0f / (255.0f * augment_.std), shift = augment_.mean / augment_.std;
  if (!train_) {
    for (size_t i = 0; i < im.pixels.size(); ++i) o[i] = im.pixels[i] * scale - shift;
    for (size_t i = 0; i < im.mask.size(); ++i) lab[i] = im.mask[i];
    return;
  }
  uint64_t r = sample_seed(idx);
  uint64_t r2 = sdk::splitmix64(r);
  double u = double(r2 >> 11) * (1.0 / 9007199254740992.0);
  double s = augment_.min_scale + (augment_.max_scale - augment_.min_scale) * u;
  // The scaled sample is (h*s) x (w*s); the crop's top-left corner in it.
  auto offset = [&](int n, uint64_t bits) {
    double o0 = (n * s - n) * double(bits % 1024) / 1023.0;  // scale < 1: a negative offset pads
    int pad = augment_.crop_padding;
    if (pad > 0) o0 += double(int((bits >> 10) % (2 * pad + 1)) - pad);
    return o0;
  };
  double oy = offset(h, r >> 8), ox = offset(w, r >> 28);
  bool flip = augment_.flip && ((r >> 60) & 1);
  const uint8_t ignore = static_cast<uint8_t>(augment_.ignore_index);
  for (int y = 0; y < h; ++y) {
    double fy = (y + oy + 0.5) / s - 0.5;
    int y0 = int(std::floor(fy));
    double wy = fy - y0;
    int ny = int(std::floor((y + oy) / s));
    for (int x = 0; x < w; ++x) {
      int xx = flip ? w - 1 - x : x;
      double fx = (xx + ox + 0.5) / s - 0.5;
      int x0 = int(std::floor(fx));
      double wx = fx - x0;
      int nx = int(std::floor((xx + ox) / s));
      bool inside = ny >= 0 && ny < h && nx >= 0 && nx < w;
      lab[size_t(y) * w + x] = inside ? im.mask[size_t(ny) * w + nx] : ignore;
      for (int ch = 0; ch < c; ++ch) {
        const uint8_t* p = im.pixels.data() + size_t(ch) * h * w;
        auto at = [&](int yy, int xx2) -> double {
          return (yy >= 0 && yy < h && xx2 >= 0 && xx2 < w) ? p[size_t(yy) * w + xx2] : 0.0;
        };
        double v = (1 - wy) * ((1 - wx) * at(y0, x0) + wx * at(y0, x0 + 1)) +
                   wy * ((1 - wx) * at(y0 + 1, x0) + wx * at(y0 + 1, x0 + 1));
        o[(size_t(ch) * h + y) * w + x] = float(v) * scale - shift;
      }
    }
  }
}

bool BatchLoader::next(Batch* out) { return prefetch_->next(out); }

void read_list_file(const std::string& list_file, const std::function<bool(const std::string&, int)>& f) {
  std::ifstream in(list_file);
  if (!in) throw IoError("cannot open list file '" + list_file + "': " + std::strerror(errno));
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    if (!f(line.substr(b, line.find_last_not_of(" \t\r") - b + 1), lineno)) break;
  }
}

}  // namespace dtrain::apps
