// The PaddleClas / PaddleSeg operators of common/transforms.h without a job:
// their geometry, per-channel normalization, seeded randomness, errors at the
// job file's line; the parallel loader's batches; sliding-window evaluation.
#include <gtest/gtest.h>

#include <cmath>

#include "common/data.h"
#include "common/slide_window.h"
#include "common/transforms.h"
#include "dtrain/error.h"

// One unity source with its program's other files (dtrain_torch_gtests).
namespace transforms_test {

using namespace dtrain;
using namespace dtrain::apps;

namespace {

std::shared_ptr<const Transforms> pipeline(const std::string& ops, Transforms::Flavour f = Transforms::Flavour::Cls) {
  Config c = Config::from_string("[data.train.transforms]\n" + ops, "job.toml");
  return Transforms::from_config(c, "data.train.transforms", f);
}

// A w x h RGB image whose pixels encode their position: R = x, G = y, B = 7.
Image gradient(int w, int h) {
  Image im{3, h, w, std::vector<uint8_t>(size_t(3) * h * w), {}, {}};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      im.pixels[size_t(y) * w + x] = uint8_t(x);
      im.pixels[size_t(h * w) + size_t(y) * w + x] = uint8_t(y);
      im.pixels[size_t(2 * h * w) + size_t(y) * w + x] = 7;
    }
  return im;
}

const char* kRaw = "NormalizeImage = { scale = 1.0, mean = [0.0], std = [1.0] }\n";

TEST(Transforms, RandCropImageGivesItsSizeAndIsAPureFunctionOfTheSeed) {
  auto t = pipeline("DecodeImage = { to_rgb = true }\nRandCropImage = { size = [24, 16] }\n" + std::string(kRaw));
  Image im = gradient(90, 50);
  auto a = t->apply(im, 1), b = t->apply(im, 1);
  EXPECT_EQ(a.width, 24);
  EXPECT_EQ(a.height, 16);
  EXPECT_EQ(a.channels, 3);
  EXPECT_EQ(a.pixels, b.pixels);
  int differ = 0;
  for (uint64_t s = 2; s < 12; ++s) differ += t->apply(im, s).pixels != a.pixels;
  EXPECT_GE(differ, 8);
}

TEST(Transforms, ResizeShortKeepsTheAspectAndCropImageTakesTheCentre) {
  auto r = pipeline("ResizeImage = { resize_short = 50 }\n" + std::string(kRaw));
  auto o = r->apply(gradient(200, 100), 0);
  EXPECT_EQ(o.width, 100);
  EXPECT_EQ(o.height, 50);
  auto t = pipeline("ResizeImage = { resize_short = 50 }\nCropImage = { size = 40 }\n" + std::string(kRaw));
  o = t->apply(gradient(100, 200), 0);
  EXPECT_EQ(o.width, 40);
  EXPECT_EQ(o.height, 40);
  // Without resizing, the centre crop of a 60x30 image at 20x10 starts at (20, 10).
  auto c = pipeline("CropImage = { size = [20, 10] }\n" + std::string(kRaw));
  o = c->apply(gradient(60, 30), 0);
  EXPECT_EQ(o.pixels[0], 20.0f);                // R = x
  EXPECT_EQ(o.pixels[size_t(20 * 10)], 10.0f);  // G = y
  EXPECT_THROW(c->apply(gradient(10, 10), 0), InvalidUsage);
}

TEST(Transforms, NormalizeImageIsPerChannel) {
  auto t = pipeline(
      "NormalizeImage = { scale = \"1.0/255.0\", mean = [0.485, 0.456, 0.406], std = [0.229, 0.224, 0.225], "
      "order = \"\" }\n");
  Image im{3, 2, 3, {}, {}, {}};
  for (uint8_t v : {255, 0, 128})
    for (int i = 0; i < 6; ++i) im.pixels.push_back(v);
  auto o = t->apply(im, 0);
  EXPECT_NEAR(o.pixels[0], (1.0 - 0.485) / 0.229, 1e-5);
  EXPECT_NEAR(o.pixels[6], (0.0 - 0.456) / 0.224, 1e-5);
  EXPECT_NEAR(o.pixels[17], (128 / 255.0 - 0.406) / 0.225, 1e-5);
}

TEST(Transforms, RandFlipImageMirrorsHalfTheSeeds) {
  auto t = pipeline("RandFlipImage = { flip_code = 1 }\n" + std::string(kRaw));
  Image im = gradient(8, 4);
  int flipped = 0;
  for (uint64_t s = 0; s < 64; ++s) {
    auto o = t->apply(im, s);
    ASSERT_TRUE(o.pixels[0] == 0.0f || o.pixels[0] == 7.0f);
    flipped += o.pixels[0] == 7.0f;
  }
  EXPECT_GT(flipped, 16);
  EXPECT_LT(flipped, 48);
}

TEST(Transforms, ErrorsNameTheFileLineAndKey) {
  auto expect_error = [](const std::string& ops, const std::string& what) {
    try {
      pipeline(ops);
      ADD_FAILURE() << "no error for " << ops;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("job.toml:4"), std::string::npos) << e.what();
    }
  };
  expect_error("DecodeImage = {}\nRandCropImage = { size = 24 }\nRandomCrop = { size = 3 }\n",
               "data.train.transforms.RandomCrop");
  expect_error("DecodeImage = {}\nRandCropImage = { size = 24 }\nCropImage = { sise = 3 }\n",
               "unknown parameter 'sise' of CropImage; did you mean 'size'?");
  expect_error("DecodeImage = {}\nRandCropImage = { size = 24 }\nNormalizeImage = { scale = \"1/x\" }\n",
               "data.train.transforms.NormalizeImage.scale");
  expect_error("DecodeImage = {}\nToCHWImage = {}\nRandCropImage = { size = 24, scale = [0.5, 0.2] }\n", "min <= max");
  expect_error("DecodeImage = {}\nToCHWImage = {}\nRandCropImage = { size = 24, interpolation = \"bicubic\" }\n",
               "'bicubic' is not available");
  EXPECT_THROW(pipeline("ResizeStepScaling = {}\n"), ConfigError);  // a seg operator in a cls pipeline
}

TEST(Transforms, SegOperatorsMoveImageAndLabelsTogether) {
  auto t = pipeline(
      "ResizeStepScaling = { min_scale_factor = 0.5, max_scale_factor = 2.0, scale_step_size = 0.25 }\n"
      "RandomPaddingCrop = { crop_size = [40, 24], im_padding_value = 0, label_padding_value = 255 }\n"
      "RandomHorizontalFlip = {}\nNormalize = { mean = [0.0], std = [1.0] }\n",
      Transforms::Flavour::Seg);
  // 2:1 image of vertical bands 8 px wide: label = band % 3, pixel = 60 * label + 40.
  Image im{1, 32, 64, std::vector<uint8_t>(32 * 64), std::vector<uint8_t>(32 * 64), {}};
  for (int y = 0; y < 32; ++y)
    for (int x = 0; x < 64; ++x) {
      im.mask[size_t(y) * 64 + x] = uint8_t((x / 8) % 3);
      im.pixels[size_t(y) * 64 + x] = uint8_t(60 * ((x / 8) % 3) + 40);
    }
  int padded = 0;
  for (uint64_t s = 0; s < 40; ++s) {
    auto o = t->apply(im, s);
    ASSERT_EQ(o.width, 40);
    ASSERT_EQ(o.height, 24);
    ASSERT_EQ(o.mask.size(), size_t(40 * 24));
    int agree = 0, labelled = 0;
    for (size_t i = 0; i < o.mask.size(); ++i) {
      float v = o.pixels[i] * 255.0f;
      if (o.mask[i] == 255) {
        EXPECT_NEAR(v, 0.0f, 1e-3);
        ++padded;
        continue;
      }
      ++labelled;
      agree += std::abs(v - (60.0f * o.mask[i] + 40.0f)) < 1.0f;
    }
    EXPECT_GE(agree, labelled * 8 / 10) << "seed " << s;  // bands' edges blur under bilinear scaling
  }
  EXPECT_GT(padded, 0);  // scale 0.5 makes 32x16 < 40x24: padded
}

// Non-square RGB images with a label; get() may run on several loader threads.
class RectDataset : public Dataset {
 public:
  size_t size() const override { return 37; }
  int channels() const override { return 3; }
  int num_classes() const override { return 3; }
  Image get(size_t i, int64_t* label) const override {
    *label = int64_t(i % 3);
    Image im = gradient(30 + int(i % 7) * 5, 20 + int(i % 5) * 6);
    for (auto& p : im.pixels) p = uint8_t(p * 3 + i);
    return im;
  }
};

TEST(BatchLoader, AnyNumberOfWorkersGivesTheSameBatches) {
  AugmentOptions a;
  a.train_transforms = pipeline(
      "RandCropImage = { size = 16, scale = [0.3, 1.0] }\nRandFlipImage = {}\n"
      "NormalizeImage = { mean = [0.5, 0.4, 0.3], std = [0.2, 0.3, 0.4] }\n");
  auto ds = std::make_shared<RectDataset>();
  auto idx = shard_indices(ds->size(), 0, 1, 7, 3, true);
  auto read = [&](int workers) {
    std::vector<Batch> out;
    BatchLoader loader(ds, idx, 5, false, a, true, 7, 3, 0, 2, workers);
    Batch b;
    while (loader.next(&b)) out.push_back(b);
    return out;
  };
  auto one = read(1), four = read(4);
  ASSERT_EQ(one.size(), 8u);
  ASSERT_EQ(four.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(four[i].index, int64_t(i));
    EXPECT_EQ(one[i].images.sizes(), torch::IntArrayRef({i + 1 < one.size() ? 5 : 2, 3, 16, 16}));
    EXPECT_TRUE(torch::equal(one[i].images, four[i].images)) << "batch " << i;
    EXPECT_TRUE(torch::equal(one[i].labels, four[i].labels)) << "batch " << i;
  }
  // Another epoch, other crops.
  BatchLoader other(ds, idx, 5, false, a, true, 7, 4, 0, 2, 4);
  Batch b;
  ASSERT_TRUE(other.next(&b));
  EXPECT_FALSE(torch::equal(b.images, one[0].images));
}

TEST(BatchLoader, AWorkersErrorComesAfterTheBatchesBeforeIt) {
  AugmentOptions a;
  a.train_transforms = pipeline("CropImage = { size = [32, 24] }\n" + std::string(kRaw));  // too big for some
  auto ds = std::make_shared<RectDataset>();
  BatchLoader loader(ds, {4, 3, 5}, 1, false, a, true, 1, 0, 0, 2, 3);
  Batch b;
  EXPECT_TRUE(loader.next(&b));                 // item 4: 50x44
  EXPECT_TRUE(loader.next(&b));                 // item 3: 45x38
  EXPECT_THROW(loader.next(&b), InvalidUsage);  // item 5: 55x20, lower than the crop
}

TEST(SlideWindow, PositionsAreTheOnesPaddleSegComputes) {
  // 128 x 64 image, 64 x 48 windows, stride 48 x 32: rows ceil(16/32)+1 = 2, cols ceil(64/48)+1 = 3.
  auto w = slide_windows(64, 128, 64, 48, 48, 32);
  ASSERT_EQ(w.size(), 6u);
  const int64_t want[6][4] = {{0, 0, 48, 64},  {0, 48, 48, 112},  {0, 64, 48, 128},
                              {16, 0, 64, 64}, {16, 48, 64, 112}, {16, 64, 64, 128}};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(w[i].y1, want[i][0]);
    EXPECT_EQ(w[i].x1, want[i][1]);
    EXPECT_EQ(w[i].y2, want[i][2]);
    EXPECT_EQ(w[i].x2, want[i][3]);
  }
  // An image smaller than the window: one window, the whole image.
  w = slide_windows(20, 30, 64, 48, 48, 32);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].y2, 20);
  EXPECT_EQ(w[0].x2, 30);
}

TEST(SlideWindow, APerPixelModelGivesTheWholeImageLogits) {
  torch::manual_seed(0);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 5, 1));
  auto x = torch::randn({2, 3, 48, 96});
  auto whole = conv->forward(x);
  int calls = 0;
  auto slid = slide_inference(
      [&](const torch::Tensor& w) {
        ++calls;
        return conv->forward(w);
      },
      x, 40, 32, 24, 16);
  EXPECT_EQ(calls, int(slide_windows(48, 96, 40, 32, 24, 16).size()));
  EXPECT_GT(calls, 4);
  EXPECT_EQ(slid.sizes(), whole.sizes());
  EXPECT_TRUE(torch::allclose(slid, whole, 1e-5, 1e-5));
}

}  // namespace

}  // namespace transforms_test
