#include "ocr/ocr.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <opencv2/imgcodecs.hpp>

#include "common/data.h"
#include "common/pictures.h"
#include "common/export.h"
#include "common/trainer.h"
#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"
#include "dtrain/fleet/metrics.h"
#include "ocr/models.h"
#include "ocr/render.h"

namespace fs = std::filesystem;

namespace dtrain::apps {

using ocr::CharDict;

const ConfigTable<OcrOptions>& ocr_table() {
  static const ConfigTable<OcrOptions> table = [] {
    using O = OcrOptions;
    ConfigTable<O> t;
    t.add("data.dataset", &O::dataset, "render | list");
    t.add("data.character_dict_path", &O::character_dict_path, "one character per line (\"\": built-in en_dict)");
    t.add("data.use_space_char", &O::use_space_char, "add ' ' to the dictionary");
    t.add("data.max_text_length", &O::max_text_length, "longest label in characters").at_least(1);
    t.add("data.image_shape", &O::image_shape, "model input [channels (1|3), 32, width]");
    t.add("data.words", &O::words, "word list, one per line (render)");
    t.add("data.fonts", &O::fonts, "font files the training and test words are rendered in");
    t.add("data.heldout_fonts", &O::heldout_fonts, "font files never trained on: a second test set");
    t.add("data.min_length", &O::min_length, "shortest word used, in characters").at_least(1);
    t.add("data.max_length", &O::max_length, "longest word used, in characters").at_least(1);
    t.add("data.test_percent", &O::test_percent, "share of the words held out for testing (by word hash)");
    t.add("data.train_samples", &O::train_samples, "rendered samples per training epoch").at_least(1);
    t.add("data.eval_samples", &O::eval_samples, "rendered test samples (distinct test words)").at_least(1);
    t.add("data.train_list", &O::train_list, "PaddleOCR list for training: image_path<TAB>label");
    t.add("data.val_list", &O::val_list, "PaddleOCR list for evaluation");
    t.add("data.root", &O::root, "folder the lists' image paths are relative to (data_dir)");
    t.add("data.unknown_chars", &O::unknown_chars,
          "error | skip: a label with a character outside the dictionary (or too long)");
    t.add("data.limit_train", &O::limit_train, "use only the first N list entries (0: all)").at_least(0);
    t.add("data.limit_eval", &O::limit_eval, "").at_least(0);
    t.add("augment.min_font_px", &O::min_font_px, "font size range before the resize to 32 rows").at_least(1);
    t.add("augment.max_font_px", &O::max_font_px, "").at_least(1);
    t.add("augment.slant", &O::slant, "largest shear");
    t.add("augment.rotate", &O::rotate, "largest rotation in degrees");
    t.add("augment.spacing", &O::spacing, "largest extra letter spacing, share of the font size");
    t.add("augment.blur", &O::blur, "probability of a blur");
    t.add("augment.noise", &O::noise, "largest pixel-noise std in grey levels");
    t.add("augment.min_contrast", &O::min_contrast, "least text/background difference in grey levels").in_range(0, 255);
    t.add("augment.texture", &O::texture, "probability of a background texture");
    t.add("augment.margin", &O::margin, "largest crop margin, share of the font size");
    t.add("augment.tight", &O::tight, "probability of a tight crop");
    t.add("augment.stroke", &O::stroke,
          "largest stroke-width change, share of the font size (emboldening or thinning; training words only; 0: "
          "off)")
        .in_range(0, 0.1);
    t.add("augment.stretch", &O::stretch,
          "largest horizontal scaling: x (1 + u) or / (1 + u) (training words only; 0: off)")
        .in_range(0, 1);
    t.add("model.backbone", &O::backbone, "vgg | mobilenetv3");
    t.add("model.width", &O::width, "backbone base channels");
    t.add("model.hidden", &O::hidden, "LSTM size per direction");
    t.add("model.layers", &O::layers, "LSTM layers");
    t.add("eval.ignore_space", &O::ignore_space, "drop spaces before comparing (PaddleOCR's default)");
    t.add("eval.filter", &O::filter, "compare lower-cased letters and digits only (PaddleOCR's is_filter)");
    t.add("eval.pictures", &O::pictures, "test images with their predictions written per evaluation (rank 0)");
    t.add("eval.picture_dir", &O::picture_dir, "where they go (\"\": <checkpoint.dir>/pictures)");
    t.add("eval.mistakes", &O::mistakes, "wrong predictions listed at the final evaluation (rank 0)");
    return t;
  }();
  return table;
}

void add_ocr_keys(ConfigSchema& s) { ocr_table().declare(s); }

Config load_ocr_config(const std::string& path, const std::vector<std::string>& overrides) {
  return load_job_config(path, overrides, add_ocr_keys, "output/ocr");
}

const std::vector<std::string>& builtin_en_dict() {
  static const std::vector<std::string> chars = [] {
    std::string all =
        "0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~!\"#$%&'()*+,-./";
    std::vector<std::string> v;
    for (char c : all) v.emplace_back(1, c);
    return v;
  }();
  return chars;
}

CharDict ocr_dictionary(const Config& cfg) {
  const OcrOptions o = ocr_table().read(cfg);
  const bool space = o.use_space_char;
  if (!o.character_dict_path.empty()) return CharDict::load(o.character_dict_path, space);
  auto chars = builtin_en_dict();
  if (space) chars.push_back(" ");
  return CharDict::from_chars(chars, "built-in en_dict");
}

namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  int channels = 1, height = 32, width = 128;
};

Shape image_shape(const Config& cfg) {
  const std::vector<int64_t> v = ocr_table().read(cfg).image_shape;
  if (v.size() != 3) config_error(cfg, "data.image_shape", "must be [channels, 32, width]");
  Shape s{int(v[0]), int(v[1]), int(v[2])};
  if (s.channels != 1 && s.channels != 3) config_error(cfg, "data.image_shape", "channels must be 1 or 3");
  if (s.height != 32)
    config_error(cfg, "data.image_shape", "the height must be 32 (the backbones reduce 32 rows to 1)");
  if (s.width < 8 || s.width % 4 != 0) config_error(cfg, "data.image_shape", "the width must be a multiple of 4, >= 8");
  return s;
}

ocr::RenderOptions render_options(const Config& cfg) {
  const ocr::RenderOptions o = ocr_table().read(cfg);
  if (o.max_font_px < o.min_font_px) config_error(cfg, "augment.max_font_px", "must be >= augment.min_font_px");
  return o;
}

// The data sets a job names: training, test, and (rendered data with held-out fonts) the held-out-font test.
struct OcrData {
  std::shared_ptr<Dataset> train, test, heldout;
  std::string describe;
};

std::vector<std::string> fonts_of(const Config& cfg, const std::string& key, const std::vector<std::string>& fonts,
                                  const std::vector<std::string>& chars) {
  for (const auto& f : fonts) {
    if (!fs::exists(f))
      config_error(cfg, key, "font file '" + f + "' does not exist (scripts/setup.sh installs the fonts)");
    std::vector<std::string> missing;
    try {
      missing = ocr::missing_glyphs(f, chars);
    } catch (const InvalidUsage& e) {
      config_error(cfg, key, e.what());
    }
    if (!missing.empty())
      config_error(cfg, key, "font '" + f + "' has no glyph for '" + sdk::join(missing, "', '") + "'");
  }
  return fonts;
}

OcrData make_data(const Config& cfg, const CharDict& dict, uint64_t seed) {
  Shape shape = image_shape(cfg);
  const OcrOptions k = ocr_table().read(cfg);
  OcrData d;
  if (k.dataset == "render") {
    size_t min_len = size_t(k.min_length), max_len = size_t(k.max_length);
    if (max_len > size_t(k.max_text_length)) config_error(cfg, "data.max_length", "must be <= data.max_text_length");
    if (int(max_len) > shape.width / 4 / 2)
      config_error(cfg, "data.max_length",
                   fmt::format("words of {} characters do not fit {} CTC steps (image width / 4): at most {}", max_len,
                               shape.width / 4, shape.width / 8));
    double pct = k.test_percent;
    if (!(pct > 0 && pct < 100)) config_error(cfg, "data.test_percent", "must be in (0, 100)");
    ocr::WordSplit split;
    try {
      split = ocr::split_words(k.words, dict, min_len, max_len, pct);
    } catch (const Error& e) {
      config_error(cfg, "data.words", e.what());
    }
    std::set<std::string> used;
    for (const auto* list : {&split.train, &split.test})
      for (const auto& w : *list)
        for (auto& ch : ocr::utf8_chars(w)) used.insert(ch);
    std::vector<std::string> chars(used.begin(), used.end());
    auto fonts = fonts_of(cfg, "data.fonts", k.fonts, chars);
    auto held = fonts_of(cfg, "data.heldout_fonts", k.heldout_fonts, chars);
    if (fonts.empty()) config_error(cfg, "data.fonts", "data.dataset = \"render\" needs at least one font file");
    for (const auto& f : held)
      if (std::find(fonts.begin(), fonts.end(), f) != fonts.end())
        config_error(cfg, "data.heldout_fonts", "font '" + f + "' is also a training font");
    // The test words in a seed-fixed order; the test set takes the first eval_samples of them.
    std::vector<std::string> test = split.test;
    std::mt19937_64 gen(seed * 7919 + 17);
    std::shuffle(test.begin(), test.end(), gen);
    size_t n_eval = std::min(test.size(), size_t(k.eval_samples));
    test.resize(n_eval);
    ocr::RenderedSetOptions o;
    o.render = render_options(cfg);
    o.channels = shape.channels;
    o.height = shape.height;
    o.width = shape.width;
    o.words = split.train;
    o.fonts = fonts;
    o.size = size_t(k.train_samples);
    o.seed = seed * 2;
    d.train = std::make_shared<ocr::RenderedDataset>(o, dict);
    // Stroke and stretch distort the training words only: the evaluation
    // sets are the same whatever they are set to.
    o.render.stroke = 0;
    o.render.stretch = 0;
    o.words = test;
    o.size = n_eval;
    o.seed = seed * 2 + 1;
    d.test = std::make_shared<ocr::RenderedDataset>(o, dict);
    if (!held.empty()) {
      o.fonts = held;
      o.seed = seed * 2 + 3;
      d.heldout = std::make_shared<ocr::RenderedDataset>(o, dict);
    }
    d.describe = fmt::format("words: {} train / {} test ({} dropped by dictionary or length), {} fonts, {} held out",
                             split.train.size(), split.test.size(), split.dropped, fonts.size(), held.size());
    return d;
  }
  if (k.dataset == "list") {
    const std::string &tl = k.train_list, &vl = k.val_list;
    if (tl.empty()) config_error(cfg, "data.train_list", "data.dataset = \"list\" needs data.train_list");
    if (vl.empty()) config_error(cfg, "data.val_list", "data.dataset = \"list\" needs data.val_list");
    const std::string& policy = k.unknown_chars;
    if (policy != "error" && policy != "skip") config_error(cfg, "data.unknown_chars", "must be \"error\" or \"skip\"");
    const auto max_len = size_t(k.max_text_length);
    auto tr = ocr::read_rec_list(tl, k.root, dict, max_len, policy == "skip", size_t(k.limit_train));
    auto va = ocr::read_rec_list(vl, k.root, dict, max_len, policy == "skip", size_t(k.limit_eval));
    d.describe = fmt::format("lists: {} ({} skipped: {} unknown characters, {} too long), {} ({} skipped)", tl,
                             tr.skipped_unknown + tr.skipped_long, tr.skipped_unknown, tr.skipped_long, vl,
                             va.skipped_unknown + va.skipped_long);
    int classes = int(dict.num_classes());
    d.train = ocr::make_list_dataset(std::move(tr), tl, classes, shape.channels, shape.height, shape.width);
    d.test = ocr::make_list_dataset(std::move(va), vl, classes, shape.channels, shape.height, shape.width);
    return d;
  }
  config_error(cfg, "data.dataset", "unknown dataset '" + k.dataset + "'; known: render, list");
}

ocr::Crnn model_from(const Config& cfg, int channels, int classes, std::string* described) {
  const OcrOptions k = ocr_table().read(cfg);
  const std::string& name = k.backbone;
  int width = int(k.width), hidden = int(k.hidden), layers = int(k.layers);
  try {
    auto m = ocr::make_crnn(name, channels, width, hidden, layers, classes);
    *described = fmt::format("model crnn {} width {} bilstm {}x{}", name, width, layers, hidden);
    return m;
  } catch (const InvalidUsage& e) {
    config_error(cfg, "model.backbone", e.what());
  }
}

AugmentOptions normalisation() {
  AugmentOptions a;  // PaddleOCR's (x / 255 - 0.5) / 0.5; the renderer does the augmenting
  a.mean = 0.5f;
  a.std = 0.5f;
  return a;
}

// Greedy decoding of logits [T, B, classes]: each sample's ids and its score
// (the mean probability of the kept steps, as PaddleOCR's CTCLabelDecode).
std::vector<std::pair<std::vector<int64_t>, double>> decode(const torch::Tensor& logits) {
  auto probs = logits.softmax(2);
  auto [best_p, best] = probs.max(2);  // [T, B]
  best = best.t().to(torch::kCPU).contiguous();
  best_p = best_p.t().to(torch::kCPU, torch::kFloat64).contiguous();
  const int64_t B = best.size(0), T = best.size(1);
  const int64_t* b = best.data_ptr<int64_t>();
  const double* p = best_p.data_ptr<double>();
  std::vector<std::pair<std::vector<int64_t>, double>> out;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t* row = b + i * T;
    double sum = 0;
    int64_t kept = 0;
    for (int64_t t = 0; t < T; ++t)
      if (row[t] != 0 && (t == 0 || row[t] != row[t - 1])) {
        sum += p[i * T + t];
        ++kept;
      }
    out.emplace_back(ocr::ctc_greedy(row, T), kept ? sum / double(kept) : 0.0);
  }
  return out;
}

std::vector<int64_t> label_of(const Batch& b, int64_t k) {
  int64_t n = b.label_lengths[k].item<int64_t>();
  auto row = b.labels[k].slice(0, 0, n).to(torch::kCPU).contiguous();
  return std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + n);
}

// Text recognition: CRNN, CTC loss with the blank at 0, greedy decoding,
// PaddleOCR's acc and norm_edit_dis summed over all workers.
class OcrTrainer : public Trainer {
 public:
  explicit OcrTrainer(Config cfg) : Trainer(std::move(cfg), "ocr") {}

 protected:
  void build() override {
    dict_ = std::make_unique<CharDict>(ocr_dictionary(cfg_));
    OcrData d = make_data(cfg_, *dict_, seed_);
    train_set_ = d.train;
    eval_set_ = d.test;
    heldout_ = d.heldout;
    log_line("data: " + d.describe + fmt::format(", dictionary {} characters", dict_->size()));
    augment_ = normalisation();
    ocr_opts_ = ocr_table().read(cfg_);
    metric_.ignore_space = ocr_opts_.ignore_space;
    metric_.filter = ocr_opts_.filter;
    net_ = model_from(cfg_, train_set_->channels(), int(dict_->num_classes()), &described_);
    model_ = net_.ptr();
  }

  std::string describe_model() const override { return described_; }

  // export_model: the CRNN's logits; CTC greedy decoding (drop repeats, then blanks) is the caller's.
  torch::Tensor infer(const torch::Tensor& images) override { return net_->forward(images); }

  std::string preprocessing_json() const override {
    std::string dict;
    for (const auto& c : dict_->chars()) dict += (dict.empty() ? "\"" : ", \"") + json_escape(c) + "\"";
    return fmt::format(
        "{{\"app\": \"ocr\", \"model\": \"{}\", {}, \"output\": \"float32 [T, N, classes] logits; CTC greedy: "
        "argmax per step, drop repeats, drop blank 0; class k >= 1 is dict[k - 1]\", \"dict\": [{}]}}",
        json_escape(described_), input_json(" grey text lines"), dict);
  }

  torch::Tensor ctc(const torch::Tensor& logits, const Batch& b) const {
    auto logp = logits.log_softmax(2);
    const int64_t T = logits.size(0), B = logits.size(1);
    auto input_lengths = torch::full({B}, T, torch::kInt64);
    // reduction none then the batch mean, as PaddleOCR's CTCLoss.
    return torch::ctc_loss(logp, b.labels, input_lengths, b.label_lengths, 0, at::Reduction::None, true).mean();
  }

  StepOutput train_step(const Batch& b) override {
    auto logits = net_->forward(b.images);
    StepOutput r;
    r.loss = ctc(logits, b);
    torch::NoGradGuard ng;
    auto preds = decode(logits.detach());
    for (size_t k = 0; k < preds.size(); ++k) r.correct += preds[k].first == label_of(b, int64_t(k)) ? 1.0 : 0.0;
    return r;
  }

  void evaluate() override {
    const TrainOptions& train = train_options();
    bool final_eval =
        state_.epoch + 1 >= train.epochs || (train.max_steps > 0 && state_.global_step >= train.max_steps);
    evaluate_set(eval_set_, "test", final_eval);
    if (heldout_) evaluate_set(heldout_, "heldout_fonts", final_eval);
  }

 private:
  void evaluate_set(const std::shared_ptr<Dataset>& set, const std::string& name, bool final_eval) {
    auto t0 = Clock::now();
    std::vector<size_t> idx;
    for (size_t i = size_t(rank_); i < set->size(); i += size_t(world_)) idx.push_back(i);
    ocr::TextMetric m = metric_;
    double loss_sum = 0;
    int pictures = rank_ == 0 ? int(ocr_opts_.pictures) : 0;
    int mistakes = rank_ == 0 && final_eval ? int(ocr_opts_.mistakes) : 0;
    std::string pic_dir = ocr_opts_.picture_dir;
    if (pic_dir.empty()) pic_dir = (fs::path(cfg_.get_string("checkpoint.dir")) / "pictures").string();
    std::vector<std::string> shown, wrong;
    if (!idx.empty()) {
      BatchLoader loader(set, idx, eval_batch_, false, augment_, false, seed_, 0);
      Batch b;
      while (loader.next(&b)) {
        b = to_device(b);
        auto logits = net_->forward(b.images);
        loss_sum += ctc(logits, b).item<double>() * double(b.labels.size(0));
        auto preds = decode(logits);
        for (size_t k = 0; k < preds.size(); ++k) {
          std::string pred = dict_->decode(preds[k].first), label = dict_->decode(label_of(b, int64_t(k)));
          bool ok = m.add(pred, label);
          size_t sample = idx[size_t(b.index * eval_batch_) + k];
          if (int(shown.size()) < pictures)
            shown.push_back(write_picture(b, int64_t(k), pic_dir, name, sample, pred, label));
          if (!ok && int(wrong.size()) < mistakes) wrong.push_back(fmt::format("'{}' -> '{}'", label, pred));
        }
      }
    }
    std::vector<double> sums{m.correct, m.distance, m.count, loss_sum};
    fleet::metrics::sum(sums);
    double n = std::max(1.0, sums[2]);
    double acc = sums[0] / n, ned = 1 - sums[1] / n, secs = std::chrono::duration<double>(Clock::now() - t0).count();
    log_line(fmt::format("eval epoch {} {}: acc {:.4f} norm_edit_dis {:.4f} loss {:.4f} ({} words, {:.1f} s)",
                         state_.epoch + 1, name, acc, ned, sums[3] / n, int64_t(sums[2]), secs));
    log_line(
        fmt::format("[EVAL] {} acc: {:.6f}, norm_edit_dis: {:.6f}, samples: {}", name, acc, ned, int64_t(sums[2])));
    if (!shown.empty()) log_line("pictures: " + sdk::join(shown, " "));
    if (!wrong.empty()) log_line("mistakes (" + name + ", rank 0's first): " + sdk::join(wrong, ", "));
    if (tb_) {
      tb_->add_scalar("eval/" + name + "/acc", float(acc), state_.global_step);
      tb_->add_scalar("eval/" + name + "/norm_edit_dis", float(ned), state_.global_step);
      tb_->add_scalar("eval/" + name + "/loss", float(sums[3] / n), state_.global_step);
      tb_->flush();
    }
  }

  std::string write_picture(const Batch& b, int64_t k, const std::string& dir, const std::string& set, size_t index,
                            const std::string& pred, const std::string& label) const {
    auto img = b.images[k].cpu();
    auto raw = ((img * augment_.std + augment_.mean) * 255).clamp(0, 255).to(torch::kUInt8).contiguous();
    Image im{int(img.size(0)),
             int(img.size(1)),
             int(img.size(2)),
             std::vector<uint8_t>(raw.data_ptr<uint8_t>(), raw.data_ptr<uint8_t>() + raw.numel()),
             {},
             {}};
    std::string path = (fs::path(dir) / fmt::format("epoch{}_{}_{}.png", state_.epoch + 1, set, index)).string();
    write_image_png(path, im);
    return fmt::format("{} ('{}' -> '{}')", path, label, pred);
  }

  OcrOptions ocr_opts_;
  std::unique_ptr<CharDict> dict_;
  std::shared_ptr<Dataset> heldout_;
  ocr::TextMetric metric_;
  ocr::Crnn net_{nullptr};
  std::string described_;
};

std::unique_ptr<Trainer> make_ocr(Config cfg) { return std::make_unique<OcrTrainer>(std::move(cfg)); }

int predict_main(int argc, char** argv) {
  CLI::App cli{"dtrain-ocr predict: the recognised text of each image (path<TAB>text<TAB>score)"};
  JobCommand jc(cli, "the job file the model was trained with", "override a key of the job file");
  std::string ckpt, list;
  std::vector<std::string> images;
  int64_t batch = 64;
  cli.add_option("images", images, "images of one line of text each");
  cli.add_option("--list", list, "also a PaddleOCR list (image_path<TAB>label): reports acc and norm_edit_dis");
  cli.add_option("--checkpoint", ckpt, "checkpoint (default: <checkpoint.dir>/latest.pt)");
  cli.add_option("--batch", batch, "images per forward pass")->check(CLI::PositiveNumber);
  return jc.run(argc, argv, "dtrain-ocr predict", load_ocr_config, [&](const Config& cfg) {
    if (images.empty() && list.empty()) throw InvalidUsage("give images, or --list FILE");
    const OcrOptions k = ocr_table().read(cfg);
    CharDict dict = ocr_dictionary(cfg);
    Shape shape = image_shape(cfg);
    std::string described;
    auto net = model_from(cfg, shape.channels, int(dict.num_classes()), &described);
    load_model_weights(ckpt, cfg.get_string("checkpoint.dir"), *net);
    net->eval();
    torch::NoGradGuard ng;
    std::vector<std::string> paths = images, labels(images.size());
    if (!list.empty()) {
      auto lf = ocr::read_rec_list(list, k.root, dict, size_t(k.max_text_length), k.unknown_chars == "skip");
      for (auto& e : lf.entries) {
        paths.push_back(e.path);
        labels.push_back(e.label);
      }
    }
    AugmentOptions a = normalisation();
    ocr::TextMetric metric;
    metric.ignore_space = k.ignore_space;
    metric.filter = k.filter;
    for (size_t start = 0; start < paths.size(); start += size_t(batch)) {
      size_t end = std::min(paths.size(), start + size_t(batch));
      auto x = torch::empty({int64_t(end - start), shape.channels, shape.height, shape.width});
      for (size_t i = start; i < end; ++i) {
        cv::Mat m = cv::imread(paths[i], shape.channels == 1 ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR);
        if (m.empty()) throw IoError("cannot read image '" + paths[i] + "'");
        Image im = ocr::model_input(m, shape.channels, shape.height, shape.width);
        auto t = torch::from_blob(im.pixels.data(), {im.channels, im.height, im.width}, torch::kUInt8);
        x[int64_t(i - start)].copy_(t.to(torch::kFloat32).div(255.0 * a.std).sub(a.mean / a.std));
      }
      auto preds = decode(net->forward(x));
      for (size_t i = start; i < end; ++i) {
        std::string text = dict.decode(preds[i - start].first);
        std::string line = fmt::format("{}\t{}\t{:.4f}", paths[i], text, preds[i - start].second);
        if (i >= images.size()) line += metric.add(text, labels[i]) ? "\tok" : "\twrong (label '" + labels[i] + "')";
        log_line(line);
      }
    }
    if (metric.count > 0)
      log_line(fmt::format("[EVAL] list {} acc: {:.6f}, norm_edit_dis: {:.6f}, samples: {}", list, metric.acc(),
                           metric.norm_edit_dis(), int64_t(metric.count)));
    return 0;
  });
}

int render_main(int argc, char** argv) {
  CLI::App cli{
      "dtrain-ocr render: rendered words as a PaddleOCR recognition data set (images/, list.txt) and the model's "
      "inputs of them stacked in one picture (sheet.png)"};
  JobCommand jc(cli, "the job file (its [data] and [augment] keys)", "override a key of the job file");
  std::string out_dir, split = "test";
  int64_t count = 16, epoch = 0;
  cli.add_option("--output", out_dir, "output folder")->required();
  cli.add_option("--split", split, "train (epoch --epoch's samples) | test | heldout")
      ->check(CLI::IsMember({"train", "test", "heldout"}));
  cli.add_option("--count", count, "images to write")->check(CLI::PositiveNumber);
  cli.add_option("--epoch", epoch, "training epoch (--split train)");
  return jc.run(argc, argv, "dtrain-ocr render", load_ocr_config, [&](const Config& cfg) {
    if (ocr_table().read(cfg).dataset != "render")
      config_error(cfg, "data.dataset", "dtrain-ocr render needs data.dataset = \"render\"");
    CharDict dict = ocr_dictionary(cfg);
    uint64_t seed = uint64_t(trainer_table().read(cfg).seed);
    OcrData d = make_data(cfg, dict, seed);
    auto ds = std::dynamic_pointer_cast<ocr::RenderedDataset>(split == "train"  ? d.train
                                                              : split == "test" ? d.test
                                                                                : d.heldout);
    if (!ds) config_error(cfg, "data.heldout_fonts", "--split heldout needs data.heldout_fonts");
    fs::create_directories(fs::path(out_dir) / "images");
    std::string list = (fs::path(out_dir) / "list.txt").string();
    std::FILE* f = std::fopen(list.c_str(), "w");
    if (!f) throw IoError("cannot write '" + list + "': " + std::strerror(errno));
    size_t n = std::min<size_t>(size_t(count), ds->size());
    Shape shape = image_shape(cfg);
    std::vector<cv::Mat> inputs;
    for (size_t i = 0; i < n; ++i) {
      auto raw = ds->raw(i, split == "train", seed, epoch);
      std::string img = fmt::format("images/{:05}.png", i);
      if (!cv::imwrite((fs::path(out_dir) / img).string(), raw.image)) throw IoError("cannot write '" + img + "'");
      std::fprintf(f, "%s\t%s\n", img.c_str(), raw.word.c_str());
      Image in = ocr::model_input(raw.image, 1, shape.height, shape.width);
      inputs.push_back(cv::Mat(shape.height, shape.width, CV_8UC1, in.pixels.data()).clone());
      inputs.push_back(cv::Mat(2, shape.width, CV_8UC1, cv::Scalar(255)));
    }
    std::fclose(f);
    cv::Mat sheet;
    cv::vconcat(inputs, sheet);
    std::string sheet_path = (fs::path(out_dir) / "sheet.png").string();
    if (!cv::imwrite(sheet_path, sheet)) throw IoError("cannot write '" + sheet_path + "'");
    log_line(fmt::format("render: {} {} words -> {}, the model's inputs stacked in {} ({})", n, split, list, sheet_path,
                         d.describe));
    return 0;
  });
}

}  // namespace

int ocr_main(int argc, char** argv) {
  return trainer_main(argc, argv, "ocr",
                      "dtrain-ocr: data-parallel text recognition (CRNN + CTC on rendered dictionary words or "
                      "PaddleOCR lists); also `dtrain-ocr predict` and `dtrain-ocr render`",
                      load_ocr_config, make_ocr, {{"predict", predict_main}, {"render", render_main}});
}

}  // namespace dtrain::apps
