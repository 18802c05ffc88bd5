#include "seg/seg.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <tuple>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "common/data.h"
#include "common/pictures.h"
#include "common/seg_data.h"
#include "common/export.h"
#include "common/slide_window.h"
#include "common/trainer.h"
#include "common/transforms.h"
#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"
#include "dtrain/fleet/metrics.h"
#include "seg/models.h"

namespace fs = std::filesystem;

namespace dtrain::apps {

const ConfigTable<SegOptions>& seg_table() {
  static const ConfigTable<SegOptions> table = [] {
    using O = SegOptions;
    ConfigTable<O> t;
    t.add("data.dataset", &O::dataset, "scenes | list");
    t.add("data.dir", &O::dir, "Fashion-MNIST IDX folder (scenes)");
    t.add("data.train_scenes", &O::train_scenes, "scenes per training epoch").at_least(1);
    t.add("data.eval_scenes", &O::eval_scenes, "test scenes").at_least(1);
    t.add("data.scene_size", &O::scene_size, "canvas size in pixels").at_least(1);
    t.add("data.min_items", &O::min_items, "items per scene, at least");
    t.add("data.max_items", &O::max_items, "items per scene, at most");
    t.add("data.train_min_items", &O::train_min_items, "items per training scene, at least (-1: min_items)")
        .at_least(-1);
    t.add("data.train_max_items", &O::train_max_items, "items per training scene, at most (-1: max_items)")
        .at_least(-1);
    t.add("data.min_item_scale", &O::min_item_scale, "item size relative to its 28 px");
    t.add("data.max_item_scale", &O::max_item_scale, "");
    t.add("data.max_overlap", &O::max_overlap, "largest share of an item's box covered by earlier ones");
    t.add("data.item_threshold", &O::item_threshold, "an item covers the pixels where its grey value exceeds this");
    t.add("data.train_list", &O::train_list, "PaddleSeg list file for training");
    t.add("data.val_list", &O::val_list, "PaddleSeg list file for evaluation");
    t.add("data.root", &O::root, "folder the list files' paths are relative to");
    t.add("data.image_size", &O::image_size, "list images are resized to this square size").at_least(1);
    t.add("data.channels", &O::channels, "1 (grey) or 3 (RGB) for list images");
    t.add("data.num_classes", &O::num_classes, "classes of a list dataset (background included)").at_least(1);
    t.add("data.ignore_index", &O::ignore_index, "label value of pixels without a class").in_range(0, 255);
    t.add("data.limit_train", &O::limit_train, "use only the first N training samples (0: all)").at_least(0);
    t.add("data.limit_eval", &O::limit_eval, "use only the first N evaluation samples (0: all)").at_least(0);
    t.add("augment.min_scale", &O::min_scale, "random scale, image and labels alike");
    t.add("augment.max_scale", &O::max_scale, "");
    t.add("augment.crop_padding", &O::crop_padding, "random crop offset jitter in pixels");
    t.add("augment.flip", &O::flip, "random horizontal flip");
    t.add("augment.mean", &O::mean, "normalisation mean (all channels)");
    t.add("augment.std", &O::std, "normalisation std (all channels)");
    t.add("model.name", &O::model, "unet | liteseg");
    t.add("model.width", &O::width, "base channels");
    t.add("model.depth", &O::depth, "unet: down-sampling stages; liteseg: residual blocks per deep stage");
    t.add("loss.dice_weight", &O::dice_weight, "weight of a Dice term added to cross-entropy");
    t.add("eval.pictures", &O::pictures, "image | truth | prediction strips per evaluation (rank 0)");
    t.add("eval.picture_dir", &O::picture_dir, "where the strips go (\"\": <checkpoint.dir>/pictures)");
    t.add("eval.flip", &O::eval_flip,
          "also segment each image mirrored and average the two (PaddleSeg's --aug_eval --flip_horizontal)");
    t.add("eval.scales", &O::scales,
          "segment each image resized by each factor and average (PaddleSeg's --aug_eval --scales)");
    t.add("eval.is_slide", &O::is_slide,
          "evaluate (and predict) by sliding windows at full resolution, as PaddleSeg's test_config; else whole "
          "images");
    t.add("eval.crop_size", &O::crop_size, "is_slide: the window [width, height]");
    t.add("eval.stride", &O::stride, "is_slide: the step [width, height] between windows");
    return t;
  }();
  return table;
}

void add_seg_keys(ConfigSchema& s) {
  seg_table().declare(s);
  s.add_open_table("data.train.transforms");  // PaddleSeg operators (common/transforms.h)
  s.add_open_table("data.eval.transforms");
}

Config load_seg_config(const std::string& path, const std::vector<std::string>& overrides) {
  return load_job_config(path, overrides, add_seg_keys, "output/seg");
}

namespace {

using Clock = std::chrono::steady_clock;

SceneOptions scene_options(const Config& cfg, bool train) {
  const SegOptions s = seg_table().read(cfg);
  SceneOptions o;
  o.count = static_cast<size_t>(train ? s.train_scenes : s.eval_scenes);
  o.size = static_cast<int>(s.scene_size);
  o.min_items = static_cast<int>(train && s.train_min_items >= 0 ? s.train_min_items : s.min_items);
  o.max_items = static_cast<int>(train && s.train_max_items >= 0 ? s.train_max_items : s.max_items);
  o.min_scale = s.min_item_scale;
  o.max_scale = s.max_item_scale;
  o.max_overlap = s.max_overlap;
  o.threshold = static_cast<int>(s.item_threshold);
  // Test scenes come from other seeds than training scenes (and other items).
  o.seed = static_cast<uint64_t>(trainer_table().read(cfg).seed) * 2 + (train ? 0 : 1);
  return o;
}

// The data sets a job file names: (train, eval).
std::pair<std::shared_ptr<Dataset>, std::shared_ptr<Dataset>> make_datasets(const Config& cfg) {
  const SegOptions o = seg_table().read(cfg);
  if (o.dataset == "scenes") {
    auto wrap = [&](bool train) {
      try {
        return make_scene_dataset(load_idx_dataset(o.dir, train), scene_options(cfg, train));
      } catch (const InvalidUsage& e) {
        config_error(cfg, "data.dataset", e.what());
      }
    };
    return {wrap(true), wrap(false)};
  }
  if (o.dataset == "list") {
    if (o.train_list.empty()) config_error(cfg, "data.train_list", "data.dataset = \"list\" needs data.train_list");
    if (o.val_list.empty()) config_error(cfg, "data.val_list", "data.dataset = \"list\" needs data.val_list");
    // With transforms each image keeps its own size until they scale and crop it.
    const int size = cfg.has("data.train.transforms") ? 0 : static_cast<int>(o.image_size);
    const int classes = static_cast<int>(o.num_classes), ch = static_cast<int>(o.channels);
    const int ignore = static_cast<int>(o.ignore_index);
    return {load_seg_list_dataset(o.train_list, o.root, classes, ignore, size, ch, size_t(o.limit_train)),
            load_seg_list_dataset(o.val_list, o.root, classes, ignore, size, ch, size_t(o.limit_eval))};
  }
  config_error(cfg, "data.dataset", "unknown dataset '" + o.dataset + "'; known: scenes, list");
}

// Channels and classes of the job's data without loading it (predict).
std::pair<int, int> data_shape(const Config& cfg) {
  const SegOptions o = seg_table().read(cfg);
  if (o.dataset == "list") return {static_cast<int>(o.channels), static_cast<int>(o.num_classes)};
  return {3, 11};
}

std::shared_ptr<SegNetImpl> model_from(const Config& cfg, int channels, int classes, std::string* described) {
  const SegOptions o = seg_table().read(cfg);
  const std::string& name = o.model;
  int width = static_cast<int>(o.width), depth = static_cast<int>(o.depth);
  try {
    auto m = make_seg_model(name, width, depth, channels, classes);
    *described = fmt::format("model {} width {} depth {}", name, width, depth);
    return m;
  } catch (const InvalidUsage& e) {
    config_error(cfg, "model.name", e.what());
  }
}

AugmentOptions augment_options(const Config& cfg) {
  const SegOptions o = seg_table().read(cfg);
  AugmentOptions a;
  a.min_scale = static_cast<float>(o.min_scale);
  a.max_scale = static_cast<float>(o.max_scale);
  a.crop_padding = static_cast<int>(o.crop_padding);
  a.flip = o.flip;
  a.mean = static_cast<float>(o.mean);
  a.std = static_cast<float>(o.std);
  a.ignore_index = static_cast<int>(o.ignore_index);
  if (!(a.std > 0)) config_error(cfg, "augment.std", "must be > 0");
  if (!(a.min_scale > 0) || a.max_scale < a.min_scale)
    config_error(cfg, "augment.max_scale", "need 0 < augment.min_scale <= augment.max_scale");
  return a;
}

// eval.is_slide, eval.crop_size, eval.stride (PaddleSeg's test_config).
struct SlideOptions {
  bool on = false;
  int64_t crop_w = 0, crop_h = 0, stride_w = 0, stride_h = 0;
};

SlideOptions slide_options(const Config& cfg) {
  const SegOptions s = seg_table().read(cfg);
  SlideOptions o;
  o.on = s.is_slide;
  if (!o.on) return o;
  for (auto [key, v, w, h] : {std::tuple{"eval.crop_size", &s.crop_size, &o.crop_w, &o.crop_h},
                              std::tuple{"eval.stride", &s.stride, &o.stride_w, &o.stride_h}}) {
    if (v->size() != 2 || (*v)[0] < 1 || (*v)[1] < 1)
      config_error(cfg, key, "eval.is_slide needs [width, height], both >= 1");
    *w = (*v)[0];
    *h = (*v)[1];
  }
  return o;
}

// The logits of a batch at its full resolution: whole images, or sliding windows.
torch::Tensor full_forward(SegNetImpl& net, const torch::Tensor& x, const SlideOptions& o) {
  if (!o.on) return net.forward(x);
  return slide_inference([&](const torch::Tensor& w) { return net.forward(w); }, x, o.crop_w, o.crop_h, o.stride_w,
                         o.stride_h);
}

// An image as the model's input [1, C, H, W]: the eval transforms, else pixels / 255 normalized by [augment].
torch::Tensor model_input(const Image& im, const AugmentOptions& a) {
  if (a.eval_transforms) {
    Transforms::Output t = a.eval_transforms->apply(im, 0);
    return torch::from_blob(t.pixels.data(), {1, t.channels, t.height, t.width}, torch::kFloat32).clone();
  }
  return torch::from_blob(const_cast<uint8_t*>(im.pixels.data()), {1, im.channels, im.height, im.width}, torch::kUInt8)
      .to(torch::kFloat32)
      .div(255.0 * a.std)
      .sub(a.mean / a.std);
}

std::string fixed4(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{:.4f}", i ? " " : "", v[i]);
  return s + "]";
}

// Per image and class, the class's pixels form a region (items of one class
// merge); its majority class is the one most of them are predicted as. Adds to
// regions[c] whether that majority is the class, to regions[C + c] one, and to `conf`
// the confusion the prediction would have if every region were all its
// majority class: recognition kept, boundaries made perfect.
void count_regions(const torch::Tensor& labels, const torch::Tensor& pred, int64_t C, int ignore,
                   std::vector<double>& conf, std::vector<double>& regions) {
  auto l = labels.to(torch::kCPU, torch::kInt64).contiguous();
  auto p = pred.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* L = l.data_ptr<int64_t>();
  const int64_t* P = p.data_ptr<int64_t>();
  const int64_t px = l.numel() / std::max<int64_t>(1, l.size(0));
  std::vector<int64_t> votes(static_cast<size_t>(C * C)), pixels(static_cast<size_t>(C));
  for (int64_t k = 0; k < l.size(0); ++k) {
    std::fill(votes.begin(), votes.end(), 0);
    std::fill(pixels.begin(), pixels.end(), 0);
    for (int64_t i = k * px; i < (k + 1) * px; ++i)
      if (L[i] != ignore) ++pixels[size_t(L[i])], ++votes[size_t(L[i] * C + P[i])];
    for (int64_t c = 0; c < C; ++c) {
      if (pixels[size_t(c)] == 0) continue;
      auto row = votes.begin() + c * C;
      int64_t major = std::max_element(row, row + C) - row;
      conf[size_t(c * C + major)] += double(pixels[size_t(c)]);
      regions[size_t(c)] += major == c;
      regions[size_t(C + c)] += 1;
    }
  }
}

// Semantic segmentation: a U-Net or PP-LiteSeg-style model, cross-entropy
// (ignore_index) plus an optional Dice term, mIoU from a confusion matrix
// summed over all workers.
class SegTrainer : public Trainer {
 public:
  explicit SegTrainer(Config cfg) : Trainer(std::move(cfg), "seg") {}

 protected:
  void build() override {
    std::tie(train_set_, eval_set_) = make_datasets(cfg_);
    if (train_set_->num_classes() != eval_set_->num_classes() || train_set_->channels() != eval_set_->channels())
      throw InvalidUsage("training and evaluation data differ in channels or classes");
    classes_ = train_set_->num_classes();
    augment_ = augment_options(cfg_);
    read_transforms(cfg_, Transforms::Flavour::Seg, train_set_->channels(), augment_);
    if (augment_.train_transforms)
      log_line("transforms: train " + augment_.train_transforms->describe() + "; eval " +
               augment_.eval_transforms->describe());
    slide_ = slide_options(cfg_);
    const SegOptions o = seg_table().read(cfg_);
    dice_ = o.dice_weight;
    flip_eval_ = o.eval_flip;
    eval_scales_ = o.scales;
    pictures_ = o.pictures;
    picture_dir_ = o.picture_dir;
    if (eval_scales_.empty()) config_error(cfg_, "eval.scales", "needs at least one factor, e.g. [1.0]");
    for (double f : eval_scales_)
      if (!(f > 0.0 && f <= 4.0)) config_error(cfg_, "eval.scales", fmt::format("factor {} is not in (0, 4]", f));
    net_ = model_from(cfg_, train_set_->channels(), classes_, &described_);
    model_ = net_;
  }

  std::string describe_model() const override { return described_; }

  // export_model: the plain forward (evaluation's flips and scales are the caller's).
  torch::Tensor infer(const torch::Tensor& images) override { return net_->forward(images); }

  std::string preprocessing_json() const override {
    return fmt::format(
        "{{\"app\": \"seg\", \"model\": \"{}\", {}, \"output\": \"float32 [N, {}, H, W] logits; argmax(1) is the "
        "class map\", \"ignore_index\": {}}}",
        json_escape(described_), input_json(), classes_, augment_.ignore_index);
  }

  torch::Tensor loss_of(const torch::Tensor& bf16_or_f32_logits, const torch::Tensor& labels) const {
    auto logits = bf16_or_f32_logits.to(torch::kFloat32);  // softmax and Dice sums in f32 under autocast
    auto loss = torch::nn::functional::cross_entropy(
        logits, labels, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(augment_.ignore_index));
    if (dice_ > 0) {
      auto valid = labels.ne(augment_.ignore_index);
      auto probs = logits.softmax(1) * valid.unsqueeze(1);
      auto onehot = torch::one_hot(labels.masked_fill(~valid, 0), classes_).permute({0, 3, 1, 2}).to(probs.dtype()) *
                    valid.unsqueeze(1);
      auto inter = (probs * onehot).sum({0, 2, 3});
      auto total = probs.sum({0, 2, 3}) + onehot.sum({0, 2, 3});
      loss = loss + dice_ * (1 - ((2 * inter + 1) / (total + 1)).mean());
    }
    return loss;
  }

  StepOutput train_step(const Batch& b) override {
    auto out = net_->forward(b.images);
    StepOutput r;
    r.loss = loss_of(out, b.labels);
    torch::NoGradGuard ng;
    auto valid = b.labels.ne(augment_.ignore_index);
    double n = valid.sum().item<double>();
    // The trainer divides by the images of the batch: report pixel accuracy per image.
    r.correct = n > 0 ? out.argmax(1).eq(b.labels).logical_and(valid).sum().item<double>() / n * b.labels.size(0) : 0;
    return r;
  }

  void evaluate() override {
    auto t0 = Clock::now();
    std::vector<size_t> idx = eval_indices();
    const int64_t C = classes_;
    std::vector<double> conf(size_t(C * C), 0.0), sums(2, 0.0);                        // loss, images
    std::vector<double> region_conf(size_t(C * C), 0.0), regions(size_t(2 * C), 0.0);  // right, then total
    int pictures = rank_ == 0 ? static_cast<int>(pictures_) : 0;
    std::string pic_dir = picture_dir_;
    if (pic_dir.empty()) pic_dir = (fs::path(cfg_.get_string("checkpoint.dir")) / "pictures").string();
    std::vector<std::string> written;
    if (!idx.empty()) {
      auto loader = eval_loader(idx);
      Batch b;
      while (loader->next(&b)) {
        b = to_device(b);
        auto out = eval_forward(b.images);
        auto pred = out.argmax(1);
        sums[0] += loss_of(out, b.labels).item<double>() * double(b.labels.size(0));
        sums[1] += double(b.labels.size(0));
        auto valid = b.labels.ne(augment_.ignore_index);
        auto cells = (b.labels.masked_select(valid) * C + pred.masked_select(valid)).bincount({}, C * C);
        auto acc = cells.to(torch::kCPU, torch::kFloat64).contiguous();
        const double* a = acc.data_ptr<double>();
        for (int64_t i = 0; i < C * C; ++i) conf[size_t(i)] += a[i];
        count_regions(b.labels, pred, C, augment_.ignore_index, region_conf, regions);
        for (int64_t k = 0; k < b.labels.size(0) && int(written.size()) < pictures; ++k)
          written.push_back(write_strip(b, pred, k, pic_dir, idx[size_t(b.index * eval_batch_ + k)]));
      }
    }
    fleet::metrics::sum(sums);
    fleet::metrics::sum(regions);
    auto sc = fleet::metrics::confusion(conf, static_cast<int>(C));
    auto rc = fleet::metrics::confusion(region_conf, static_cast<int>(C));
    std::vector<double> region_acc(static_cast<size_t>(C));
    double right = 0, total = 0;
    for (int64_t c = 0; c < C; ++c) {
      right += regions[size_t(c)], total += regions[size_t(C + c)];
      region_acc[size_t(c)] = regions[size_t(C + c)] > 0 ? regions[size_t(c)] / regions[size_t(C + c)] : 0;
    }
    double n = std::max(1.0, sums[1]);
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    log_line(
        fmt::format("eval epoch {}: mIoU {:.4f} acc {:.4f} kappa {:.4f} dice {:.4f} loss {:.4f} ({} images, "
                    "{:.1f} s)",
                    state_.epoch + 1, sc.miou, sc.accuracy, sc.kappa, sc.mdice, sums[0] / n, int64_t(sums[1]), secs));
    log_line(fmt::format("[EVAL] #Images: {} mIoU: {:.4f} Acc: {:.4f} Kappa: {:.4f} Dice: {:.4f}", int64_t(sums[1]),
                         sc.miou, sc.accuracy, sc.kappa, sc.mdice));
    log_line("[EVAL] Class IoU: " + fixed4(sc.class_iou));
    log_line("[EVAL] Class Precision: " + fixed4(sc.class_precision));
    log_line("[EVAL] Class Recall: " + fixed4(sc.class_recall));
    log_line(fmt::format("[EVAL] Regions: {} right {:.4f}; mIoU with each all its majority class: {:.4f}",
                         int64_t(total), total > 0 ? right / total : 0.0, rc.miou));
    log_line("[EVAL] Class Region Acc: " + fixed4(region_acc));
    if (!written.empty()) log_line("pictures: " + sdk::join(written, " "));
    if (tb_) {
      tb_->add_scalar("eval/miou", float(sc.miou), state_.global_step);
      tb_->add_scalar("eval/acc", float(sc.accuracy), state_.global_step);
      tb_->add_scalar("eval/kappa", float(sc.kappa), state_.global_step);
      tb_->add_scalar("eval/loss", float(sums[0] / n), state_.global_step);
      tb_->flush();
    }
  }

 private:
  std::string write_strip(const Batch& b, const torch::Tensor& pred, int64_t k, const std::string& dir,
                          size_t index) const {
    auto img = b.images[k].cpu();
    const int c = int(img.size(0)), h = int(img.size(1)), w = int(img.size(2));
    torch::Tensor px;
    if (const auto& t = augment_.eval_transforms) {
      auto per = [&](const std::vector<double>& v) {
        return torch::tensor(std::vector<float>(v.begin(), v.end())).view({-1, 1, 1});
      };
      px = (img * per(t->stddev()) + per(t->mean())) / t->scale();
    } else {
      px = (img * augment_.std + augment_.mean) * 255;
    }
    auto raw = px.clamp(0, 255).to(torch::kUInt8).contiguous();
    Image im{c, h, w, std::vector<uint8_t>(raw.data_ptr<uint8_t>(), raw.data_ptr<uint8_t>() + raw.numel()), {}, {}};
    auto t = b.labels[k].to(torch::kCPU, torch::kUInt8).contiguous();
    auto p = pred[k].to(torch::kCPU, torch::kUInt8).contiguous();
    std::vector<uint8_t> truth(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + t.numel());
    std::vector<uint8_t> guess(p.data_ptr<uint8_t>(), p.data_ptr<uint8_t>() + p.numel());
    std::string path = (fs::path(dir) / fmt::format("epoch{}_{}.png", state_.epoch + 1, index)).string();
    write_image_png(path, side_by_side(im, truth, guess, palette()));
    return path;
  }

  // The logits, or with eval.flip / eval.scales the log of the mean of the softmax maps of
  // each resized (and mirrored) copy, brought back to the input's size: a log-probability,
  // so the loss and argmax read it as logits.
  torch::Tensor eval_forward(const torch::Tensor& x) const {
    if (!flip_eval_ && eval_scales_.size() == 1 && eval_scales_[0] == 1.0) return full_forward(*net_, x, slide_);
    namespace F = torch::nn::functional;
    const std::vector<int64_t> size{x.size(2), x.size(3)};
    torch::Tensor sum;
    int n = 0;
    auto add = [&](const torch::Tensor& logits) {
      auto p = logits.size(2) == size[0] && logits.size(3) == size[1]
                   ? logits.softmax(1)
                   : F::interpolate(logits,
                                    F::InterpolateFuncOptions().size(size).mode(torch::kBilinear).align_corners(false))
                         .softmax(1);
      sum = n++ == 0 ? p : sum + p;
    };
    for (double f : eval_scales_) {
      auto xi = f == 1.0
                    ? x
                    : F::interpolate(x, F::InterpolateFuncOptions()
                                            .size(std::vector<int64_t>{std::max<int64_t>(8, std::lround(f * size[0])),
                                                                       std::max<int64_t>(8, std::lround(f * size[1]))})
                                            .mode(torch::kBilinear)
                                            .align_corners(false));
      add(full_forward(*net_, xi, slide_));
      if (flip_eval_) add(full_forward(*net_, xi.flip({3}), slide_).flip({3}));
    }
    return (sum / n).log();
  }

  std::shared_ptr<SegNetImpl> net_;
  std::string described_;
  int classes_ = 0;
  double dice_ = 0;
  int64_t pictures_ = 0;
  std::string picture_dir_;
  bool flip_eval_ = false;
  std::vector<double> eval_scales_{1.0};
  SlideOptions slide_;
};

std::unique_ptr<Trainer> make_seg(Config cfg) { return std::make_unique<SegTrainer>(std::move(cfg)); }

int predict_main(int argc, char** argv) {
  CLI::App cli{"dtrain-seg predict: the predicted mask of each image, as a palette PNG (pixel value = class id)"};
  JobCommand jc(cli, "the job file the model was trained with", "override a key of the job file");
  std::string out_dir, ckpt;
  std::vector<std::string> images;
  cli.add_option("images", images, "images to segment")->required();
  cli.add_option("--output", out_dir, "folder for the masks (<stem>.png)")->required();
  cli.add_option("--checkpoint", ckpt, "checkpoint (default: <checkpoint.dir>/latest.pt)");
  return jc.run(argc, argv, "dtrain-seg predict", load_seg_config, [&](const Config& cfg) {
    auto [channels, classes] = data_shape(cfg);
    std::string described;
    auto net = model_from(cfg, channels, classes, &described);
    load_model_weights(ckpt, cfg.get_string("checkpoint.dir"), *net);
    net->eval();
    torch::NoGradGuard ng;
    AugmentOptions a = augment_options(cfg);
    read_transforms(cfg, Transforms::Flavour::Seg, channels, a);
    const SlideOptions slide = slide_options(cfg);
    auto colours = palette();
    for (const auto& path : images) {
      cv::Mat m = cv::imread(path, channels == 1 ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR);
      if (m.empty()) throw IoError("cannot read image '" + path + "'");
      if (channels == 3) cv::cvtColor(m, m, cv::COLOR_BGR2RGB);
      Image im{channels, m.rows, m.cols, {}, {}, {}};
      im.pixels.resize(size_t(channels) * m.rows * m.cols);
      auto chw = torch::from_blob(m.data, {m.rows, m.cols, channels}, torch::kUInt8).permute({2, 0, 1}).contiguous();
      std::copy_n(chw.data_ptr<uint8_t>(), im.pixels.size(), im.pixels.data());
      auto x = model_input(im, a);
      auto pred = full_forward(*net, x, slide).argmax(1)[0].to(torch::kUInt8).contiguous();
      std::vector<uint8_t> mask(pred.data_ptr<uint8_t>(), pred.data_ptr<uint8_t>() + pred.numel());
      std::string out = (fs::path(out_dir) / (fs::path(path).stem().string() + ".png")).string();
      write_label_png(out, int(pred.size(0)), int(pred.size(1)), mask, colours);
      auto counts = pred.flatten().to(torch::kInt64).bincount({}, classes);
      std::string present;
      for (int c = 0; c < classes; ++c)
        if (counts[c].item<int64_t>() > 0) present += fmt::format("{}{}", present.empty() ? "" : " ", c);
      log_line(fmt::format("predict: {} -> {} ({}x{}{}, classes present: {})", path, out, pred.size(1), pred.size(0),
                           slide.on ? fmt::format(", sliding {}x{} windows", slide.crop_w, slide.crop_h) : "",
                           present));
    }
    return 0;
  });
}

int export_main(int argc, char** argv) {
  CLI::App cli{"dtrain-seg export: composed scenes as a PaddleSeg data set (images/, labels/, list.txt)"};
  JobCommand jc(cli, "the job file (its [data] scene keys)", "override a key of the job file");
  std::string out_dir, split = "eval";
  int64_t count = 16;
  cli.add_option("--output", out_dir, "output folder")->required();
  cli.add_option("--split", split, "train | eval")->check(CLI::IsMember({"train", "eval"}));
  cli.add_option("--count", count, "scenes to write")->check(CLI::PositiveNumber);
  return jc.run(argc, argv, "dtrain-seg export", load_seg_config, [&](const Config& cfg) {
    auto [train, eval] = make_datasets(cfg);
    auto ds = split == "train" ? train : eval;
    fs::create_directories(fs::path(out_dir) / "images");
    std::string list = (fs::path(out_dir) / "list.txt").string();
    std::FILE* f = std::fopen(list.c_str(), "w");
    if (!f) throw IoError("cannot write '" + list + "': " + std::strerror(errno));
    auto colours = palette();
    for (size_t i = 0; i < std::min<size_t>(size_t(count), ds->size()); ++i) {
      int64_t label = 0;
      Image im = ds->get(i, &label);
      std::string img = fmt::format("images/{:05}.png", i), lab = fmt::format("labels/{:05}.png", i);
      write_image_png((fs::path(out_dir) / img).string(), im);
      write_label_png((fs::path(out_dir) / lab).string(), im.height, im.width, im.mask, colours);
      std::fprintf(f, "%s %s\n", img.c_str(), lab.c_str());
    }
    std::fclose(f);
    log_line(fmt::format("export: {} scenes ({}) -> {}", std::min<size_t>(size_t(count), ds->size()), split, list));
    return 0;
  });
}

}  // namespace

int seg_main(int argc, char** argv) {
  return trainer_main(argc, argv, "seg",
                      "dtrain-seg: data-parallel semantic segmentation (U-Net / PP-LiteSeg-style on Fashion-MNIST "
                      "scenes or PaddleSeg lists); also `dtrain-seg predict` and `dtrain-seg export`",
                      load_seg_config, make_seg, {{"predict", predict_main}, {"export", export_main}});
}

}  // namespace dtrain::apps
