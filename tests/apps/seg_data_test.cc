// The segmentation runtime's parts without a job: PaddleSeg scores of a
// confusion matrix, palette label PNGs read back, scenes composed
// deterministically, and image/label alignment under augmentation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/data.h"
#include "common/pictures.h"
#include "common/seg_data.h"
#include "dtrain/error.h"
#include "dtrain/fleet/metrics.h"

// One unity source with its program's other files (dtrain_torch_gtests).
namespace seg_data_test {

namespace fs = std::filesystem;
using namespace dtrain::apps;

namespace {

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("dtrain_seg_test." + std::to_string(getpid()) + "." + name)).string();
}

// 8x8 blocks: pixel value 200 and label 1 on "on" blocks, 40 and label 0 elsewhere.
class BlocksDataset : public Dataset {
 public:
  size_t size() const override { return 8; }
  int channels() const override { return 1; }
  int num_classes() const override { return 2; }
  Image get(size_t index, int64_t* label) const override {
    *label = -1;
    const int n = 32;
    Image im{1, n, n, std::vector<uint8_t>(n * n), std::vector<uint8_t>(n * n), {}};
    for (int y = 0; y < n; ++y)
      for (int x = 0; x < n; ++x) {
        bool on = ((x / 8 + y / 8 + int(index)) % 3) == 0;
        im.pixels[y * n + x] = on ? 200 : 40;
        im.mask[y * n + x] = on ? 1 : 0;
      }
    return im;
  }
};

// Share of labelled pixels whose label agrees with the (denormalised) image.
double agreement(const Batch& b, const AugmentOptions& a, int64_t* ignored) {
  auto raw = (b.images.squeeze(1) * a.std + a.mean) * 255;
  auto valid = b.labels.ne(a.ignore_index);
  auto expect = raw.gt(120).to(torch::kInt64);
  *ignored = (~valid).sum().item<int64_t>();
  return expect.eq(b.labels).logical_and(valid).sum().item<double>() / valid.sum().item<double>();
}

}  // namespace

TEST(SegmentationScores, AsPaddleSegComputesThem) {
  // Rows are labels, columns predictions; class 2 never occurs.
  std::vector<double> m{5, 1, 0, 2, 3, 0, 0, 0, 0};
  auto s = dtrain::fleet::metrics::segmentation_scores(m, 3);
  ASSERT_EQ(s.class_iou.size(), 3u);
  EXPECT_DOUBLE_EQ(s.class_iou[0], 5.0 / 8.0);
  EXPECT_DOUBLE_EQ(s.class_iou[1], 3.0 / 6.0);
  EXPECT_DOUBLE_EQ(s.class_iou[2], 0.0);
  EXPECT_DOUBLE_EQ(s.miou, (5.0 / 8.0 + 0.5) / 3.0);
  EXPECT_DOUBLE_EQ(s.accuracy, 8.0 / 11.0);
  EXPECT_NEAR(s.kappa, 26.0 / 59.0, 1e-12);
  EXPECT_DOUBLE_EQ(s.class_precision[0], 5.0 / 7.0);
  EXPECT_DOUBLE_EQ(s.class_recall[1], 3.0 / 5.0);
  EXPECT_DOUBLE_EQ(s.pixels, 11.0);
  EXPECT_THROW(dtrain::fleet::metrics::segmentation_scores(m, 2), dtrain::InvalidUsage);
}

TEST(LabelPng, PaletteRoundTripKeepsClassIds) {
  const int h = 5, w = 7;
  std::vector<uint8_t> labels(h * w);
  for (int i = 0; i < h * w; ++i) labels[i] = static_cast<uint8_t>(i % 4 == 3 ? 255 : i % 11);
  std::string path = temp_path("labels.png");
  write_label_png(path, h, w, labels, palette());
  int rh = 0, rw = 0;
  EXPECT_EQ(read_label_image(path, &rh, &rw), labels);
  EXPECT_EQ(rh, h);
  EXPECT_EQ(rw, w);
  auto colours = palette();
  EXPECT_EQ(colours[0], (Rgb{0, 0, 0}));
  EXPECT_EQ(colours[1], (Rgb{128, 0, 0}));
  EXPECT_EQ(colours[2], (Rgb{0, 128, 0}));
  EXPECT_EQ(colours[255], (Rgb{255, 255, 255}));
  fs::remove(path);
  EXPECT_THROW(read_label_image(path, &rh, &rw), dtrain::IoError);
}

TEST(Scenes, DeterministicLabelledAndDistinctPerSeed) {
  // Items: a 28x28 bright square of class 4 and a bright bar of class 7.
  std::vector<uint8_t> px(2 * 28 * 28, 0);
  for (int y = 6; y < 22; ++y)
    for (int x = 6; x < 22; ++x) px[y * 28 + x] = 220;
  for (int y = 2; y < 26; ++y)
    for (int x = 12; x < 16; ++x) px[784 + y * 28 + x] = 180;
  struct Items : Dataset {
    std::vector<uint8_t> px;
    size_t size() const override { return 2; }
    int channels() const override { return 1; }
    int num_classes() const override { return 10; }
    Image get(size_t i, int64_t* label) const override {
      *label = i == 0 ? 4 : 7;
      return Image{1, 28, 28, std::vector<uint8_t>(px.begin() + i * 784, px.begin() + (i + 1) * 784), {}, {}};
    }
  };
  auto items = std::make_shared<Items>();
  items->px = px;
  SceneOptions o;
  o.count = 20;
  o.size = 48;
  o.seed = 3;
  auto a = make_scene_dataset(items, o);
  EXPECT_EQ(a->num_classes(), 11);
  EXPECT_EQ(a->channels(), 3);
  int64_t l = 0;
  for (size_t i = 0; i < a->size(); ++i) {
    Image x = a->get(i, &l), y = a->get(i, &l);
    EXPECT_EQ(x.pixels, y.pixels);
    EXPECT_EQ(x.mask, y.mask);
    size_t labelled = 0;
    for (uint8_t v : x.mask) {
      EXPECT_TRUE(v == 0 || v == 5 || v == 8) << int(v);
      labelled += v != 0;
    }
    EXPECT_GT(labelled, 60u) << "scene " << i;
  }
  o.seed = 4;
  auto b = make_scene_dataset(items, o);
  EXPECT_NE(a->get(0, &l).pixels, b->get(0, &l).pixels);
  o.max_items = 1;
  o.min_items = 2;
  EXPECT_THROW(make_scene_dataset(items, o), dtrain::InvalidUsage);
}

TEST(BatchLoader, SegmentationAugmentationKeepsImageAndLabelsAligned) {
  auto ds = std::make_shared<BlocksDataset>();
  std::vector<size_t> idx{0, 1, 2, 3, 4, 5, 6, 7};
  AugmentOptions a;
  a.mean = 0.5f;
  a.std = 0.25f;
  a.flip = true;
  a.crop_padding = 3;
  // Scale 1 and integer shifts: image and labels agree on every labelled pixel.
  {
    BatchLoader loader(ds, idx, 8, false, a, true, 11, 0);
    Batch b;
    ASSERT_TRUE(loader.next(&b));
    EXPECT_EQ(b.labels.sizes(), (std::vector<int64_t>{8, 32, 32}));
    int64_t ignored = 0;
    EXPECT_DOUBLE_EQ(agreement(b, a, &ignored), 1.0);
    EXPECT_GT(ignored, 0) << "no shifted-in pixels: the crop jitter did nothing";
  }
  // Random scales: they agree except on the blocks' interpolated edges.
  a.min_scale = 0.7f;
  a.max_scale = 1.4f;
  {
    BatchLoader loader(ds, idx, 8, false, a, true, 11, 1);
    Batch b;
    ASSERT_TRUE(loader.next(&b));
    int64_t ignored = 0;
    EXPECT_GT(agreement(b, a, &ignored), 0.9);
  }
  // Evaluation batches are untouched.
  {
    BatchLoader loader(ds, idx, 8, false, a, false, 11, 0);
    Batch b;
    ASSERT_TRUE(loader.next(&b));
    int64_t unused = 0;
    Image first = ds->get(0, &unused);
    auto lab = b.labels[0].flatten();
    for (int i = 0; i < 32 * 32; ++i) ASSERT_EQ(lab[i].item<int64_t>(), first.mask[i]);
  }
}

}  // namespace seg_data_test
