#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "common/data.h"
#include "ocr/text.h"

// Word images for recognition: FreeType rendering with the augmentations
// recognisers are trained with, PaddleOCR's resize-and-pad to the model's
// input, and the two data sets (rendered dictionary words, PaddleOCR lists).
namespace dtrain::apps::ocr {

// How a word is rendered and augmented. Every random choice comes from the
// sample's seed: the same (text, font, seed) gives the same pixels.
struct RenderOptions {
  int min_font_px = 22, max_font_px = 40;  // font size before the resize to the input height
  double slant = 0.2;                      // largest horizontal shear (x += slant * y)
  double rotate = 2.0;                     // largest rotation, degrees
  double spacing = 0.06;                   // largest extra letter spacing, share of the font size
  double blur = 0.4;                       // probability of a Gaussian blur (sigma 0.3..1.2 at 32 px)
  double noise = 10;                       // largest std of the pixel noise (grey levels)
  int min_contrast = 70;                   // least |text - background| in grey levels
  double texture = 0.5;                    // probability of a smooth background texture
  double margin = 0.3;                     // largest crop margin, share of the font size
  double tight = 0.3;                      // probability of a tight crop (margins 0..0.05, may clip ink)
  double stroke = 0;                       // largest stroke-width change (FreeType emboldening; negative
                                           // thins), share of the font size; 0: off, no draw
  double stretch = 0;                      // largest horizontal scaling, x (1 + u) or / (1 + u); 0: off, no draw
  bool augment = true;                     // false: black text on white, upright, fixed size and margin
};

// Renders `text` in the font file `font` as a grey image (8-bit, one channel)
// cropped around the text. Font files are opened once per thread and kept.
// InvalidUsage when the font cannot be loaded or lacks a character.
cv::Mat render_text(const std::string& text, const std::string& font, uint64_t seed, const RenderOptions& o);

// The characters of `chars` that `font` has no glyph for (empty: all there).
std::vector<std::string> missing_glyphs(const std::string& font, const std::vector<std::string>& chars);

// PaddleOCR's resize_norm_img: the image resized to `height` rows and
// min(width, ceil(height * aspect)) columns, then padded on the right to
// `width` with mid grey (128, PaddleOCR's 0 after its (x - 0.5) / 0.5).
// `channels` 1 (grey) or 3 (RGB); `m` is grey or OpenCV BGR.
Image model_input(const cv::Mat& m, int channels, int height, int width);

// The dictionary words a rendered data set uses, split by word: a word is a
// test word when the FNV-1a hash of its bytes falls in the lowest
// test_percent of the range, so no test word is ever rendered in training.
struct WordSplit {
  std::vector<std::string> train, test;
  size_t dropped = 0;  // words with characters outside the dictionary, or too long/short
};
// Reads a word list (one word per line, e.g. /usr/share/dict/words), keeps
// the distinct words of min_length..max_length characters all in dict, and
// splits them. Errors name the file.
WordSplit split_words(const std::string& words_file, const CharDict& dict, size_t min_length, size_t max_length,
                      double test_percent);

// Rendered words. Training samples (get_train) draw a word and a font from
// (seed, epoch, index), so each epoch sees new renderings; evaluation samples
// (get) are fixed: sample i is word i mod words, in font (i + i / words) mod
// fonts, rendered with a seed from (set seed, i).
struct RenderedSetOptions {
  std::vector<std::string> words, fonts;
  size_t size = 0;  // samples per epoch (training) or in the set
  uint64_t seed = 0;
  RenderOptions render;
  int channels = 1, height = 32, width = 128;
};
class RenderedDataset : public Dataset {
 public:
  // InvalidUsage when a word has a character outside dict, or words or fonts are empty.
  RenderedDataset(RenderedSetOptions o, const CharDict& dict);
  size_t size() const override { return o_.size; }
  int channels() const override { return o_.channels; }
  int num_classes() const override { return classes_; }
  Image get(size_t index, int64_t* label) const override;
  Image get_train(size_t index, uint64_t seed, int64_t epoch, int64_t* label) const override;
  // The rendering before model_input (its natural size), with its word and font.
  struct Raw {
    cv::Mat image;
    std::string word, font;
  };
  Raw raw(size_t index, bool train, uint64_t seed = 0, int64_t epoch = 0) const;

 private:
  struct Pick {
    size_t word, font;
    uint64_t seed;
  };
  Pick pick(size_t index, bool train, uint64_t seed, int64_t epoch) const;

  RenderedSetOptions o_;
  std::vector<std::vector<int64_t>> ids_;
  int classes_ = 0;
};

// A PaddleOCR recognition list (see read_rec_list), images decoded with
// OpenCV when fetched and passed through model_input.
std::shared_ptr<Dataset> make_list_dataset(ListFile list, const std::string& list_file, int num_classes, int channels,
                                           int height, int width);

// The text of a sample (the dictionary's decode of Image::text).
inline std::string sample_text(const Image& im, const CharDict& dict) { return dict.decode(im.text); }

}  // namespace dtrain::apps::ocr
