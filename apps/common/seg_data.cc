#include "common/seg_data.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "common/image_io.h"
#include "common/pictures.h"
#include "dtrain/error.h"
#include "dtrain/sdk/random.h"

namespace fs = std::filesystem;

namespace dtrain::apps {

namespace {

class SceneDataset : public Dataset {
 public:
  SceneDataset(std::shared_ptr<Dataset> items, SceneOptions o) : items_(std::move(items)), o_(o) {}
  size_t size() const override { return o_.count; }
  int channels() const override { return 3; }
  int num_classes() const override { return items_->num_classes() + 1; }

  Image get(size_t index, int64_t* label) const override {
    *label = -1;
    const int S = o_.size;
    std::mt19937_64 gen(o_.seed * sdk::kSplitMix64Gamma + index * 0xD1B54A32D192ED03ULL + 1);
    auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(gen); };
    Image im{3, S, S, std::vector<uint8_t>(size_t(3) * S * S), std::vector<uint8_t>(size_t(S) * S, 0), {}};

    // Background: a random dark colour, two stripe patterns and per-pixel
    // noise, kept below the items' brightness (see the tint below).
    double base[3], amp1 = uni(6, 22), amp2 = uni(4, 14);
    for (double& b : base) b = uni(15, 80);
    double t1 = uni(0, M_PI), f1 = uni(0.15, 0.6), t2 = uni(0, M_PI), f2 = uni(0.05, 0.25), ph = uni(0, 6.3);
    std::uniform_int_distribution<int> noise(-8, 8);
    for (int y = 0; y < S; ++y)
      for (int x = 0; x < S; ++x) {
        double s1 = std::sin(f1 * (x * std::cos(t1) + y * std::sin(t1)));
        double s2 = std::sin(f2 * (x * std::cos(t2) + y * std::sin(t2)) + ph);
        for (int c = 0; c < 3; ++c) {
          double v = base[c] + amp1 * s1 * (c == 0 ? 1.0 : 0.6) + amp2 * s2 + noise(gen);
          im.pixels[(size_t(c) * S + y) * S + x] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
        }
      }

    int n = std::uniform_int_distribution<int>(o_.min_items, o_.max_items)(gen);
    std::vector<cv::Rect> boxes;
    for (int k = 0; k < n; ++k) {
      size_t j = static_cast<size_t>(gen() % items_->size());
      int64_t cls = 0;
      Image item = items_->get(j, &cls);
      int sz = std::max(4, int(std::lround(item.width * uni(o_.min_scale, o_.max_scale))));
      cv::Mat src(item.height, item.width, CV_8UC1, item.pixels.data()), it;
      cv::resize(src, it, cv::Size(sz, sz), 0, 0, cv::INTER_LINEAR);
      if (gen() & 1) cv::flip(it, it, 1);
      cv::Rect box;
      for (int attempt = 0; attempt < 12; ++attempt) {
        int lo = std::min(0, S - sz), hi = std::max(0, S - sz);
        box = cv::Rect(std::uniform_int_distribution<int>(lo, hi)(gen), std::uniform_int_distribution<int>(lo, hi)(gen),
                       sz, sz);
        double worst = 0;
        for (const auto& b : boxes) worst = std::max(worst, double((box & b).area()) / double(box.area()));
        if (worst <= o_.max_overlap) break;
      }
      boxes.push_back(box);
      // Every pixel the label gives to the item is drawn at half its tint or
      // more, so even an item's faintest covered pixels stand out from the
      // background (at 0.35 of the tint, the faintest were as dark as it).
      double tint[3];
      for (double& t : tint) t = uni(140, 255);
      for (int y = 0; y < sz; ++y) {
        int cy = box.y + y;
        if (cy < 0 || cy >= S) continue;
        for (int x = 0; x < sz; ++x) {
          int cx = box.x + x;
          uint8_t v = it.at<uint8_t>(y, x);
          if (cx < 0 || cx >= S || v <= o_.threshold) continue;
          im.mask[size_t(cy) * S + cx] = static_cast<uint8_t>(cls + 1);
          for (int c = 0; c < 3; ++c)
            im.pixels[(size_t(c) * S + cy) * S + cx] = static_cast<uint8_t>(tint[c] * (0.5 + 0.5 * v / 255.0));
        }
      }
    }
    return im;
  }

 private:
  std::shared_ptr<Dataset> items_;
  SceneOptions o_;
};

struct SegEntry {
  std::string image, label;
  int line = 0;
};

class SegListDataset : public ListFileDataset {
 public:
  SegListDataset(std::vector<SegEntry> entries, std::string list_file, int classes, int ignore, int size, int channels)
      : ListFileDataset(std::move(list_file), classes, size, channels), entries_(std::move(entries)), ignore_(ignore) {}
  size_t size() const override { return entries_.size(); }

  Image get(size_t i, int64_t* label) const override {
    *label = -1;
    const SegEntry& e = entries_[i];
    const std::string at = where(e.line);
    cv::Mat m = read_image(e.image, channels_, at);
    int lh = 0, lw = 0;
    std::vector<uint8_t> lab = read_label_image(e.label, &lh, &lw);
    if (lh != m.rows || lw != m.cols)
      throw IoError("label file '" + e.label + "' is " + std::to_string(lw) + "x" + std::to_string(lh) +
                    " but its image '" + e.image + "' is " + std::to_string(m.cols) + "x" + std::to_string(m.rows) +
                    at);
    for (size_t p = 0; p < lab.size(); ++p)
      if (lab[p] >= classes_ && lab[p] != ignore_)
        throw IoError("label file '" + e.label + "': pixel value " + std::to_string(lab[p]) + " at (x " +
                      std::to_string(p % lw) + ", y " + std::to_string(p / lw) + ") is outside [0, " +
                      std::to_string(classes_) + ") and is not the ignore index " + std::to_string(ignore_) +
                      " (data.num_classes = " + std::to_string(classes_) + ")" + at);
    cv::Mat lm(lh, lw, CV_8UC1, lab.data());
    if (size_ > 0 && (m.rows != size_ || m.cols != size_)) {
      cv::Mat r, lr;
      cv::resize(m, r, cv::Size(size_, size_), 0, 0, cv::INTER_LINEAR);
      cv::resize(lm, lr, cv::Size(size_, size_), 0, 0, cv::INTER_NEAREST);
      m = r;
      lm = lr;
    }
    return Image{channels_, m.rows, m.cols, chw_pixels(m, channels_), chw_pixels(lm, 1), {}};
  }

 private:
  std::vector<SegEntry> entries_;
  int ignore_;
};

}  // namespace

std::shared_ptr<Dataset> make_scene_dataset(std::shared_ptr<Dataset> items, const SceneOptions& o) {
  if (!items || items->size() == 0) throw InvalidUsage("scene dataset: no items to compose scenes from");
  if (items->channels() != 1) throw InvalidUsage("scene dataset: items must be grey images");
  if (o.size < 8) throw InvalidUsage("scene dataset: canvas size must be >= 8, got " + std::to_string(o.size));
  if (o.min_items < 0 || o.max_items < o.min_items)
    throw InvalidUsage("scene dataset: need 0 <= min_items <= max_items");
  if (!(o.min_scale > 0) || o.max_scale < o.min_scale)
    throw InvalidUsage("scene dataset: need 0 < min_scale <= max_scale");
  if (o.count == 0) throw InvalidUsage("scene dataset: count must be >= 1");
  if (o.threshold < 0 || o.threshold > 254) throw InvalidUsage("scene dataset: item threshold must be in [0, 254]");
  return std::make_shared<SceneDataset>(std::move(items), o);
}

std::shared_ptr<Dataset> load_seg_list_dataset(const std::string& list_file, const std::string& root, int num_classes,
                                               int ignore_index, int size, int channels, size_t limit) {
  if (channels != 1 && channels != 3)
    throw InvalidUsage("segmentation list: channels must be 1 or 3, got " + std::to_string(channels));
  if (num_classes < 1 || num_classes > 255)
    throw InvalidUsage("segmentation list: num_classes must be in [1, 255], got " + std::to_string(num_classes));
  std::vector<SegEntry> entries;
  auto resolve = [&](const std::string& rel) {
    return (fs::path(rel).is_absolute() ? fs::path(rel) : fs::path(root) / rel).string();
  };
  read_list_file(list_file, [&](const std::string& body, int lineno) {
    std::string where = list_file + ":" + std::to_string(lineno);
    size_t sep = body.find_last_of(" \t");
    if (sep == std::string::npos) throw InvalidUsage(where + ": expected 'image_path label_path', got '" + body + "'");
    std::string img = body.substr(0, sep), lab = body.substr(sep + 1);
    img.erase(img.find_last_not_of(" \t") + 1);
    SegEntry entry{resolve(img), resolve(lab), lineno};
    if (!fs::exists(entry.image)) throw IoError(where + ": image '" + entry.image + "' does not exist");
    if (!fs::exists(entry.label)) throw IoError(where + ": label file '" + entry.label + "' does not exist");
    entries.push_back(std::move(entry));
    return limit == 0 || entries.size() < limit;
  });
  if (entries.empty()) throw InvalidUsage("list file '" + list_file + "' has no entries");
  return std::make_shared<SegListDataset>(std::move(entries), list_file, num_classes, ignore_index, size, channels);
}

}  // namespace dtrain::apps
