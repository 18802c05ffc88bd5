#include "seg/seg.h"

#include <cmath>
#include <cstring>
#include <filesystem>

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

void add_seg_keys(ConfigSchema& s) {
  s.add("data.dataset", ConfigType::String, "\"scenes\"", "scenes | list");
  s.add("data.dir", ConfigType::String, "\"/usr/share/datasets/fashion-mnist\"", "Fashion-MNIST IDX folder (scenes)");
  s.add("data.train_scenes", ConfigType::Int, "4000", "scenes per training epoch");
  s.add("data.eval_scenes", ConfigType::Int, "500", "test scenes");
  s.add("data.scene_size", ConfigType::Int, "64", "canvas size in pixels");
  s.add("data.min_items", ConfigType::Int, "2", "items per scene, at least");
  s.add("data.max_items", ConfigType::Int, "3", "items per scene, at most");
  s.add("data.train_min_items", ConfigType::Int, "-1", "items per training scene, at least (-1: min_items)");
  s.add("data.train_max_items", ConfigType::Int, "-1", "items per training scene, at most (-1: max_items)");
  s.add("data.min_item_scale", ConfigType::Float, "0.9", "item size relative to its 28 px");
  s.add("data.max_item_scale", ConfigType::Float, "1.3", "");
  s.add("data.max_overlap", ConfigType::Float, "0.3", "largest share of an item's box covered by earlier ones");
  s.add("data.item_threshold", ConfigType::Int, "12", "an item covers the pixels where its grey value exceeds this");
  s.add("data.train_list", ConfigType::String, "\"\"", "PaddleSeg list file for training");
  s.add("data.val_list", ConfigType::String, "\"\"", "PaddleSeg list file for evaluation");
  s.add("data.root", ConfigType::String, "\"\"", "folder the list files' paths are relative to");
  s.add("data.image_size", ConfigType::Int, "64", "list images are resized to this square size");
  s.add("data.channels", ConfigType::Int, "3", "1 (grey) or 3 (RGB) for list images");
  s.add("data.num_classes", ConfigType::Int, "11", "classes of a list dataset (background included)");
  s.add("data.ignore_index", ConfigType::Int, "255", "label value of pixels without a class");
  s.add("data.limit_train", ConfigType::Int, "0", "use only the first N training samples (0: all)");
  s.add("data.limit_eval", ConfigType::Int, "0", "use only the first N evaluation samples (0: all)");
  s.add("augment.min_scale", ConfigType::Float, "0.8", "random scale, image and labels alike");
  s.add("augment.max_scale", ConfigType::Float, "1.25", "");
  s.add("augment.crop_padding", ConfigType::Int, "4", "random crop offset jitter in pixels");
  s.add("augment.flip", ConfigType::Bool, "true", "random horizontal flip");
  s.add("augment.mean", ConfigType::Float, "0.4", "normalisation mean (all channels)");
  s.add("augment.std", ConfigType::Float, "0.25", "normalisation std (all channels)");
  s.add("model.name", ConfigType::String, "\"unet\"", "unet | liteseg");
  s.add("model.width", ConfigType::Int, "16", "base channels");
  s.add("model.depth", ConfigType::Int, "3", "unet: down-sampling stages; liteseg: residual blocks per deep stage");
  s.add("loss.dice_weight", ConfigType::Float, "0", "weight of a Dice term added to cross-entropy");
  s.add("eval.pictures", ConfigType::Int, "4", "image | truth | prediction strips per evaluation (rank 0)");
  s.add("eval.flip", ConfigType::Bool, "false",
        "also segment each image mirrored and average the two (PaddleSeg's --aug_eval --flip_horizontal)");
  s.add("eval.scales", ConfigType::FloatList, "[1.0]",
        "segment each image resized by each factor and average (PaddleSeg's --aug_eval --scales)");
  s.add("eval.is_slide", ConfigType::Bool, "false",
        "evaluate (and predict) by sliding windows at full resolution, as PaddleSeg's test_config; else whole images");
  s.add("eval.crop_size", ConfigType::IntList, "[]", "is_slide: the window [width, height]");
  s.add("eval.stride", ConfigType::IntList, "[]", "is_slide: the step [width, height] between windows");
  s.add_open_table("data.train.transforms");  // PaddleSeg operators (common/transforms.h)
  s.add_open_table("data.eval.transforms");
  s.add("eval.picture_dir", ConfigType::String, "\"\"", "where the strips go (\"\": <checkpoint.dir>/pictures)");
}

Config load_seg_config(const std::string& path, const std::vector<std::string>& overrides) {
  return load_job_config(path, overrides, add_seg_keys, "output/seg");
}

namespace {

using Clock = std::chrono::steady_clock;

size_t limit_of(const Config& cfg, const std::string& key) {
  return static_cast<size_t>(std::max<int64_t>(0, cfg.get_int(key)));
}

SceneOptions scene_options(const Config& cfg, bool train) {
  SceneOptions o;
  o.count = static_cast<size_t>(positive(cfg, train ? "data.train_scenes" : "data.eval_scenes"));
  o.size = static_cast<int>(positive(cfg, "data.scene_size"));
  o.min_items = static_cast<int>(cfg.get_int("data.min_items"));
  o.max_items = static_cast<int>(cfg.get_int("data.max_items"));
  if (train)
    for (auto [key, items] :
         {std::pair{"data.train_min_items", &o.min_items}, {"data.train_max_items", &o.max_items}}) {
      int64_t n = cfg.get_int(key);
      if (n < -1) config_error(cfg, key, "must be >= 0, or -1 for as many as the evaluation scenes");
      if (n >= 0) *items = static_cast<int>(n);
    }
  o.min_scale = cfg.get_float("data.min_item_scale");
  o.max_scale = cfg.get_float("data.max_item_scale");
  o.max_overlap = cfg.get_float("data.max_overlap");
  o.threshold = static_cast<int>(cfg.get_int("data.item_threshold"));
  // Test scenes come from other seeds than training scenes (and other items).
  o.seed = static_cast<uint64_t>(cfg.get_int("train.seed")) * 2 + (train ? 0 : 1);
  return o;
}

// The data sets a job file names: (train, eval).
std::pair<std::shared_ptr<Dataset>, std::shared_ptr<Dataset>> make_datasets(const Config& cfg) {
  std::string ds = cfg.get_string("data.dataset");
  if (ds == "scenes") {
    std::string dir = cfg.get_string("data.dir");
    auto wrap = [&](bool train) {
      try {
        return make_scene_dataset(load_idx_dataset(dir, train), scene_options(cfg, train));
      } catch (const InvalidUsage& e) {
        config_error(cfg, "data.dataset", e.what());
      }
    };
    return {wrap(true), wrap(false)};
  }
  if (ds == "list") {
    int classes = static_cast<int>(positive(cfg, "data.num_classes"));
    int size = static_cast<int>(positive(cfg, "data.image_size"));
    int ch = static_cast<int>(cfg.get_int("data.channels"));
    int ignore = static_cast<int>(cfg.get_int("data.ignore_index"));
    std::string root = cfg.get_string("data.root");
    std::string tl = cfg.get_string("data.train_list"), vl = cfg.get_string("data.val_list");
    if (tl.empty()) config_error(cfg, "data.train_list", "data.dataset = \"list\" needs data.train_list");
    if (vl.empty()) config_error(cfg, "data.val_list", "data.dataset = \"list\" needs data.val_list");
    if (cfg.has("data.train.transforms")) size = 0;  // each image its own size: the transforms scale and crop
    return {load_seg_list_dataset(tl, root, classes, ignore, size, ch, limit_of(cfg, "data.limit_train")),
            load_seg_list_dataset(vl, root, classes, ignore, size, ch, limit_of(cfg, "data.limit_eval"))};
  }
  config_error(cfg, "data.dataset", "unknown dataset '" + ds + "'; known: scenes, list");
}

// Channels and classes of the job's data without loading it (predict).
std::pair<int, int> data_shape(const Config& cfg) {
  if (cfg.get_string("data.dataset") == "list")
    return {static_cast<int>(cfg.get_int("data.channels")), static_cast<int>(positive(cfg, "data.num_classes"))};
  return {3, 11};
}

std::shared_ptr<SegNetImpl> model_from(const Config& cfg, int channels, int classes, std::string* described) {
  std::string name = cfg.get_string("model.name");
  int width = static_cast<int>(cfg.get_int("model.width")), depth = static_cast<int>(cfg.get_int("model.depth"));
  try {
    auto m = make_seg_model(name, width, depth, channels, classes);
    *described = fmt::format("model {} width {} depth {}", name, width, depth);
    return m;
  } catch (const InvalidUsage& e) {
    config_error(cfg, "model.name", e.what());
  }
}

AugmentOptions augment_options(const Config& cfg) {
  AugmentOptions a;
  a.min_scale = static_cast<float>(cfg.get_float("augment.min_scale"));
  a.max_scale = static_cast<float>(cfg.get_float("augment.max_scale"));
  a.crop_padding = static_cast<int>(cfg.get_int("augment.crop_padding"));
  a.flip = cfg.get_bool("augment.flip");
  a.mean = static_cast<float>(cfg.get_float("augment.mean"));
  a.std = static_cast<float>(cfg.get_float("augment.std"));
  a.ignore_index = static_cast<int>(cfg.get_int("data.ignore_index"));
  if (!(a.std > 0)) config_error(cfg, "augment.std", "must be > 0");
  if (!(a.min_scale > 0) || a.max_scale < a.min_scale)
    config_error(cfg, "augment.max_scale", "need 0 < augment.min_scale <= augment.max_scale");
  if (a.ignore_index < 0 || a.ignore_index > 255) config_error(cfg, "data.ignore_index", "must be in [0, 255]");
  return a;
}

// eval.is_slide, eval.crop_size, eval.stride (PaddleSeg's test_config).
struct SlideOptions {
  bool on = false;
  int64_t crop_w = 0, crop_h = 0, stride_w = 0, stride_h = 0;
};

SlideOptions slide_options(const Config& cfg) {
  SlideOptions o;
  o.on = cfg.get_bool("eval.is_slide");
  if (!o.on) return o;
  for (const char* key : {"eval.crop_size", "eval.stride"}) {
    auto v = cfg.get_int_list(key);
    if (v.size() != 2 || v[0] < 1 || v[1] < 1) config_error(cfg, key, "eval.is_slide needs [width, height], both >= 1");
    (key[5] == 'c' ? o.crop_w : o.stride_w) = v[0];
    (key[5] == 'c' ? o.crop_h : o.stride_h) = v[1];
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
    dice_ = cfg_.get_float("loss.dice_weight");
    flip_eval_ = cfg_.get_bool("eval.flip");
    eval_scales_ = cfg_.get_float_list("eval.scales");
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
    sync_buffers();
    model_->eval();
    torch::NoGradGuard ng;
    auto t0 = Clock::now();
    std::vector<size_t> idx = eval_indices();
    const int64_t C = classes_;
    std::vector<double> conf(size_t(C * C), 0.0), sums(2, 0.0);                        // loss, images
    std::vector<double> region_conf(size_t(C * C), 0.0), regions(size_t(2 * C), 0.0);  // right, then total
    int pictures = rank_ == 0 ? static_cast<int>(cfg_.get_int("eval.pictures")) : 0;
    std::string pic_dir = cfg_.get_string("eval.picture_dir");
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
  bool flip_eval_ = false;
  std::vector<double> eval_scales_{1.0};
  SlideOptions slide_;
};

std::unique_ptr<Trainer> make_seg(Config cfg) { return std::make_unique<SegTrainer>(std::move(cfg)); }

int guarded(const char* what, const std::function<int()>& body) {
  return run_guarded(fmt::format("dtrain-seg {}: error: ", what), body);
}

int predict_main(int argc, char** argv) {
  CLI::App cli{"dtrain-seg predict: the predicted mask of each image, as a palette PNG (pixel value = class id)"};
  std::string job, out_dir, ckpt;
  std::vector<std::string> images, overrides;
  cli.add_option("job", job, "the job file the model was trained with")->required();
  cli.add_option("images", images, "images to segment")->required();
  cli.add_option("--output", out_dir, "folder for the masks (<stem>.png)")->required();
  cli.add_option("--checkpoint", ckpt, "checkpoint (default: <checkpoint.dir>/latest.pt)");
  cli.add_option("-o,--override", overrides, "override a key of the job file")->allow_extra_args(false);
  CLI11_PARSE(cli, argc, argv);
  return guarded("predict", [&] {
    Config cfg = load_seg_config(job, overrides);
    auto [channels, classes] = data_shape(cfg);
    std::string described;
    auto net = model_from(cfg, channels, classes, &described);
    if (ckpt.empty()) ckpt = (fs::path(cfg.get_string("checkpoint.dir")) / "latest.pt").string();
    if (!fs::exists(ckpt)) throw IoError("checkpoint '" + ckpt + "' does not exist (train first, or --checkpoint)");
    {
      torch::serialize::InputArchive ar, m;
      ar.load_from(ckpt);
      ar.read("model", m);
      net->load(m);
    }
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
  std::string job, out_dir, split = "eval";
  int64_t count = 16;
  std::vector<std::string> overrides;
  cli.add_option("job", job, "the job file (its [data] scene keys)")->required();
  cli.add_option("--output", out_dir, "output folder")->required();
  cli.add_option("--split", split, "train | eval")->check(CLI::IsMember({"train", "eval"}));
  cli.add_option("--count", count, "scenes to write")->check(CLI::PositiveNumber);
  cli.add_option("-o,--override", overrides, "override a key of the job file")->allow_extra_args(false);
  CLI11_PARSE(cli, argc, argv);
  return guarded("export", [&] {
    Config cfg = load_seg_config(job, overrides);
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
  if (argc > 1 && std::strcmp(argv[1], "predict") == 0) return predict_main(argc - 1, argv + 1);
  if (argc > 1 && std::strcmp(argv[1], "export") == 0) return export_main(argc - 1, argv + 1);
  return trainer_main(argc, argv, "seg",
                      "dtrain-seg: data-parallel semantic segmentation (U-Net / PP-LiteSeg-style on Fashion-MNIST "
                      "scenes or PaddleSeg lists); also `dtrain-seg predict` and `dtrain-seg export`",
                      load_seg_config, make_seg);
}

}  // namespace dtrain::apps
