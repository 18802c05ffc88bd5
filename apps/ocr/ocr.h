#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/config.h"
#include "dtrain/config_table.h"
#include "ocr/render.h"
#include "ocr/text.h"

namespace dtrain::apps {

// The OCR app's own job-file keys (besides [job], [communicator], [plugins],
// [role], [strategy] and the trainer's [train], [eval], [checkpoint], [log],
// [debug] from common/trainer.h), named as PaddleOCR names them where it has them:
//
//   [data]     dataset = "render" | "list"; character_dict_path ("": the
//              built-in en_dict, as apps/ocr/en_dict.txt), use_space_char,
//              max_text_length, image_shape = [C, 32, W]; prefetch;
//              render: words (word list), fonts, heldout_fonts, min_length,
//              max_length, test_percent, train_samples (per epoch), eval_samples;
//              list: train_list, val_list, root, unknown_chars ("error" | "skip"),
//              limit_train, limit_eval
//   [augment]  min_font_px, max_font_px, slant, rotate, spacing, blur, noise,
//              min_contrast, texture, margin, tight, stroke, stretch
//   [model]    backbone (vgg | mobilenetv3), width, hidden, layers
//   [eval]     ignore_space, filter (PaddleOCR's RecMetric), pictures, picture_dir, mistakes
void add_ocr_keys(ConfigSchema& schema);

// The text-recognition app's own keys above with their defaults; ocr_table()
// declares and reads them. The [augment] keys are the renderer's options
// (ocr/render.h), whose initializers are their defaults.
struct OcrOptions : ocr::RenderOptions {
  std::string dataset = "render";
  std::string character_dict_path;
  bool use_space_char = false;
  int64_t max_text_length = 25;
  std::vector<int64_t> image_shape{1, 32, 128};
  std::string words = "/usr/share/dict/words";
  std::vector<std::string> fonts, heldout_fonts;
  int64_t min_length = 1, max_length = 12;
  double test_percent = 10;
  int64_t train_samples = 20000, eval_samples = 2000;
  std::string train_list, val_list, root;
  std::string unknown_chars = "error";
  int64_t limit_train = 0, limit_eval = 0;
  std::string backbone = "vgg";
  int64_t width = 32, hidden = 96, layers = 2;
  bool ignore_space = true, filter = false;
  int64_t pictures = 0;
  std::string picture_dir;
  int64_t mistakes = 10;
};
const ConfigTable<OcrOptions>& ocr_table();

// Loads the job file with its overrides and validates it against the full schema.
Config load_ocr_config(const std::string& path, const std::vector<std::string>& overrides);

// The job's character dictionary: data.character_dict_path (or the built-in
// en_dict) with data.use_space_char. Errors name the file and line.
ocr::CharDict ocr_dictionary(const Config& cfg);
// The built-in dictionary's characters (PaddleOCR's en_dict order).
const std::vector<std::string>& builtin_en_dict();

// `dtrain-ocr JOB.toml [-o k=v]...` trains; `dtrain-ocr predict JOB.toml
// IMAGE... [--list FILE]` prints the recognised text of each image;
// `dtrain-ocr render JOB.toml --output DIR` writes rendered samples as a
// PaddleOCR recognition data set (images/, list.txt). Returns the exit code;
// errors are printed as one clear line and give 1.
int ocr_main(int argc, char** argv);

}  // namespace dtrain::apps
