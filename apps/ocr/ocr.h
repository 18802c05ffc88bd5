#pragma once

#include <string>
#include <vector>

#include "dtrain/config.h"
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
