#include "cls/cls.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/data.h"
#include "common/export.h"
#include "common/models.h"
#include "common/trainer.h"
#include "common/transforms.h"
#include "dtrain/error.h"

namespace dtrain::apps {

void add_cls_keys(ConfigSchema& s) {
  s.add("data.dataset", ConfigType::String, "\"fashion-mnist\"", "fashion-mnist | list");
  s.add("data.dir", ConfigType::String, "\"/usr/share/datasets/fashion-mnist\"", "IDX files folder");
  s.add("data.train_list", ConfigType::String, "\"\"", "PaddleClas list file for training");
  s.add("data.val_list", ConfigType::String, "\"\"", "PaddleClas list file for evaluation");
  s.add("data.root", ConfigType::String, "\"\"", "folder the list files' paths are relative to");
  s.add("data.image_size", ConfigType::Int, "32", "list images are resized to this square size");
  s.add("data.channels", ConfigType::Int, "3", "1 (grey) or 3 (RGB) for list images");
  s.add("data.num_classes", ConfigType::Int, "10", "classes of a list dataset");
  s.add("data.limit_train", ConfigType::Int, "0", "use only the first N training images (0: all)");
  s.add("data.limit_eval", ConfigType::Int, "0", "use only the first N evaluation images (0: all)");
  s.add("augment.crop_padding", ConfigType::Int, "2", "random crop after padding (0: off)");
  s.add("augment.flip", ConfigType::Bool, "true", "random horizontal flip");
  s.add("augment.mean", ConfigType::Float, "0.286", "normalisation mean (all channels)");
  s.add("augment.std", ConfigType::Float, "0.353", "normalisation std (all channels)");
  s.add_open_table("data.train.transforms");  // PaddleClas operators (common/transforms.h)
  s.add_open_table("data.eval.transforms");
  s.add("model.name", ConfigType::String, "\"resnet20\"",
        "resnet20 | resnet32 | resnet56 | resnet18 | resnet50 | liteseg");
  s.add("model.width", ConfigType::Float, "1.0", "channel multiplier");
}

Config load_cls_config(const std::string& path, const std::vector<std::string>& overrides) {
  return load_job_config(path, overrides, add_cls_keys, "output/cls");
}

namespace {

using Clock = std::chrono::steady_clock;

// Image classification: a ResNet chosen by [model], cross-entropy, top-1/top-5.
class ClsTrainer : public Trainer {
 public:
  explicit ClsTrainer(Config cfg) : Trainer(std::move(cfg), "cls") {}

 protected:
  void build() override {
    const Config& cfg = cfg_;
    std::string ds = cfg.get_string("data.dataset");
    size_t limit_train = static_cast<size_t>(std::max<int64_t>(0, cfg.get_int("data.limit_train")));
    size_t limit_eval = static_cast<size_t>(std::max<int64_t>(0, cfg.get_int("data.limit_eval")));
    if (ds == "fashion-mnist" || ds == "mnist") {
      std::string dir = cfg.get_string("data.dir");
      train_set_ = load_idx_dataset(dir, true, limit_train);
      eval_set_ = load_idx_dataset(dir, false, limit_eval);
    } else if (ds == "list") {
      if (std::string why = list_datasets_unavailable(); !why.empty()) config_error(cfg, "data.dataset", why);
      int classes = static_cast<int>(positive(cfg, "data.num_classes"));
      int size = static_cast<int>(positive(cfg, "data.image_size"));
      int ch = static_cast<int>(cfg.get_int("data.channels"));
      std::string root = cfg.get_string("data.root");
      std::string tl = cfg.get_string("data.train_list"), vl = cfg.get_string("data.val_list");
      if (tl.empty()) config_error(cfg, "data.train_list", "data.dataset = \"list\" needs data.train_list");
      if (vl.empty()) config_error(cfg, "data.val_list", "data.dataset = \"list\" needs data.val_list");
      if (cfg.has("data.train.transforms")) size = 0;  // each image its own size: the transforms crop
      train_set_ = load_list_dataset(tl, root, classes, size, ch, limit_train);
      eval_set_ = load_list_dataset(vl, root, classes, size, ch, limit_eval);
    } else {
      config_error(cfg, "data.dataset", "unknown dataset '" + ds + "'; known: fashion-mnist, mnist, list");
    }
    augment_.crop_padding = static_cast<int>(cfg.get_int("augment.crop_padding"));
    augment_.flip = cfg.get_bool("augment.flip");
    augment_.mean = static_cast<float>(cfg.get_float("augment.mean"));
    augment_.std = static_cast<float>(cfg.get_float("augment.std"));
    if (!(augment_.std > 0)) config_error(cfg, "augment.std", "must be > 0");
    read_transforms(cfg, Transforms::Flavour::Cls, train_set_->channels(), augment_);
    if (augment_.train_transforms)
      log_line("transforms: train " + augment_.train_transforms->describe() + "; eval " +
               augment_.eval_transforms->describe());

    name_ = cfg.get_string("model.name");
    width_ = cfg.get_float("model.width");
    try {
      any_ = make_model(name_, width_, train_set_->channels(), train_set_->num_classes());
    } catch (const InvalidUsage& e) {
      config_error(cfg, "model.name", e.what());
    }
    model_ = any_.ptr();
  }

  std::string describe_model() const override { return fmt::format("model {} width {}", name_, width_); }

  torch::Tensor infer(const torch::Tensor& images) override { return any_.forward(images); }

  std::string preprocessing_json() const override {
    return fmt::format("{{\"app\": \"cls\", \"model\": \"{}\", {}, \"output\": \"float32 [N, {}] logits\"}}", name_,
                       input_json(), eval_set_->num_classes());
  }

  StepOutput train_step(const Batch& b) override {
    auto out = any_.forward(b.images);
    StepOutput r;
    r.loss = torch::nn::functional::cross_entropy(out, b.labels);
    r.correct = out.argmax(1).eq(b.labels).sum().item<double>();
    return r;
  }

  void evaluate() override {
    sync_buffers();
    model_->eval();
    torch::NoGradGuard ng;
    auto t0 = Clock::now();
    std::vector<size_t> idx = eval_indices();
    std::vector<double> sums(4, 0.0);  // loss, top1, top5, count
    if (!idx.empty()) {
      auto loader = eval_loader(idx);
      Batch b;
      while (loader->next(&b)) {
        b = to_device(b);
        auto out = any_.forward(b.images);
        sums[0] += torch::nn::functional::cross_entropy(
                       out, b.labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                       .item<double>();
        int64_t k = std::min<int64_t>(5, out.size(1));
        auto top = std::get<1>(out.topk(k, 1));
        auto hit = top.eq(b.labels.unsqueeze(1));
        sums[1] += hit.select(1, 0).sum().item<double>();
        sums[2] += hit.any(1).sum().item<double>();
        sums[3] += double(b.labels.size(0));
      }
    }
    fleet::metrics::sum(sums);
    double n = std::max(1.0, sums[3]);
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    log_line(fmt::format("eval epoch {}: top1 {:.4f} top5 {:.4f} loss {:.4f} ({} images, {:.1f} s)", state_.epoch + 1,
                         sums[1] / n, sums[2] / n, sums[0] / n, int64_t(sums[3]), secs));
    if (tb_) {
      tb_->add_scalar("eval/top1", float(sums[1] / n), state_.global_step);
      tb_->add_scalar("eval/top5", float(sums[2] / n), state_.global_step);
      tb_->add_scalar("eval/loss", float(sums[0] / n), state_.global_step);
      tb_->flush();
    }
  }

 private:
  torch::nn::AnyModule any_;
  std::string name_;
  double width_ = 1.0;
};

std::unique_ptr<Trainer> make_cls(Config cfg) { return std::make_unique<ClsTrainer>(std::move(cfg)); }

}  // namespace

int cls_main(int argc, char** argv) {
  return trainer_main(argc, argv, "cls",
                      "dtrain-cls: data-parallel image classification (ResNet on Fashion-MNIST or PaddleClas lists)",
                      load_cls_config, make_cls);
}

}  // namespace dtrain::apps
