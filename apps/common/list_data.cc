// The list data sets' image files, decoded with OpenCV; compiled only where
// the apps have OpenCV (DTRAIN_APPS_OPENCV, apps/common/CMakeLists.txt),
// list_data_none.cc otherwise.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "common/data.h"
#include "common/image_io.h"
#include "dtrain/error.h"

namespace fs = std::filesystem;

namespace dtrain::apps {

namespace {

class ListDataset : public ListFileDataset {
 public:
  ListDataset(std::vector<std::string> paths, std::vector<int64_t> labels, std::vector<int> lines,
              std::string list_file, int classes, int size, int channels)
      : ListFileDataset(std::move(list_file), classes, size, channels),
        paths_(std::move(paths)),
        labels_(std::move(labels)),
        lines_(std::move(lines)) {}
  size_t size() const override { return paths_.size(); }
  Image get(size_t i, int64_t* label) const override {
    cv::Mat m = read_image(paths_[i], channels_, where(lines_[i]));
    if (size_ > 0 && (m.rows != size_ || m.cols != size_)) {
      cv::Mat r;
      cv::resize(m, r, cv::Size(size_, size_), 0, 0, cv::INTER_AREA);
      m = r;
    }
    *label = labels_[i];
    return Image{channels_, m.rows, m.cols, chw_pixels(m, channels_), {}, {}};
  }

 private:
  std::vector<std::string> paths_;
  std::vector<int64_t> labels_;
  std::vector<int> lines_;
};

}  // namespace

std::string list_datasets_unavailable() { return ""; }

cv::Mat read_image(const std::string& path, int channels, const std::string& where) {
  cv::Mat m = cv::imread(path, channels == 1 ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR);
  if (m.empty()) throw IoError("cannot decode image '" + path + "'" + where);
  return m;
}

std::vector<uint8_t> chw_pixels(const cv::Mat& m, int channels) {
  cv::Mat rgb = m;
  if (channels == 3) cv::cvtColor(m, rgb, cv::COLOR_BGR2RGB);
  const int h = rgb.rows, w = rgb.cols;
  std::vector<uint8_t> px(size_t(channels) * h * w);
  for (int y = 0; y < h; ++y) {
    const uint8_t* row = rgb.ptr<uint8_t>(y);
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c) px[(size_t(c) * h + y) * w + x] = row[x * channels + c];
  }
  return px;
}

std::shared_ptr<Dataset> load_list_dataset(const std::string& list_file, const std::string& root, int num_classes,
                                           int size, int channels, size_t limit) {
  if (channels != 1 && channels != 3)
    throw InvalidUsage("list dataset: channels must be 1 or 3, got " + std::to_string(channels));
  std::vector<std::string> paths;
  std::vector<int64_t> labels;
  std::vector<int> lines;
  read_list_file(list_file, [&](const std::string& entry, int lineno) {
    std::string where = list_file + ":" + std::to_string(lineno);
    size_t sep = entry.find_last_of(" \t");
    if (sep == std::string::npos) throw InvalidUsage(where + ": expected 'relative/path label', got '" + entry + "'");
    std::string rel = entry.substr(0, sep);
    rel.erase(rel.find_last_not_of(" \t") + 1);
    std::string lab = entry.substr(sep + 1);
    int64_t label = 0;
    try {
      size_t used = 0;
      label = std::stoll(lab, &used);
      if (used != lab.size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      throw InvalidUsage(where + ": label '" + lab + "' is not an integer");
    }
    if (label < 0 || label >= num_classes)
      throw InvalidUsage(where + ": label " + std::to_string(label) + " is out of range [0, " +
                         std::to_string(num_classes) + ") (data.num_classes = " + std::to_string(num_classes) + ")");
    fs::path p = fs::path(rel).is_absolute() ? fs::path(rel) : fs::path(root) / rel;
    if (!fs::exists(p)) throw IoError(where + ": image '" + p.string() + "' does not exist");
    paths.push_back(p.string());
    labels.push_back(label);
    lines.push_back(lineno);
    return limit == 0 || paths.size() < limit;
  });
  if (paths.empty()) throw InvalidUsage("list file '" + list_file + "' has no entries");
  return std::make_shared<ListDataset>(std::move(paths), std::move(labels), std::move(lines), list_file, num_classes,
                                       size, channels);
}

}  // namespace dtrain::apps
