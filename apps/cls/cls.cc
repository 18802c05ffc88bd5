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

const ConfigTable<ClsOptions>& cls_table() {
  static const ConfigTable<ClsOptions> table = [] {
    using O = ClsOptions;
    ConfigTable<O> t;
    t.add("data.dataset", &O::dataset, "fashion-mnist | list");
    t.add("data.dir", &O::dir, "IDX files folder");
    t.add("data.train_list", &O::train_list, "PaddleClas list file for training");
    t.add("data.val_list", &O::val_list, "PaddleClas list file for evaluation");
    t.add("data.root", &O::root, "folder the list files' paths are relative to");
    t.add("data.image_size", &O::image_size, "list images are resized to this square size").at_least(1);
    t.add("data.channels", &O::channels, "1 (grey) or 3 (RGB) for list images");
    t.add("data.num_classes", &O::num_classes, "classes of a list dataset").at_least(1);
    t.add("data.limit_train", &O::limit_train, "use only the first N training images (0: all)").at_least(0);
    t.add("data.limit_eval", &O::limit_eval, "use only the first N evaluation images (0: all)").at_least(0);
    t.add("augment.crop_padding", &O::crop_padding, "random crop after padding (0: off)");
    t.add("augment.flip", &O::flip, "random horizontal flip");
    t.add("augment.mean", &O::mean, "normalisation mean (all channels)");
    t.add("augment.std", &O::std, "normalisation std (all channels)");
    t.add("model.name", &O::model, "resnet20 | resnet32 | resnet56 | resnet18 | resnet50 | liteseg");
    t.add("model.width", &O::width, "channel multiplier");
    return t;
  }();
  return table;
}

void add_cls_keys(ConfigSchema& s) {
  cls_table().declare(s);
  s.add_open_table("data.train.transforms");  // PaddleClas operators (common/transforms.h)
  s.add_open_table("data.eval.transforms");
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
    const ClsOptions o = cls_table().read(cfg);
    const auto limit_train = static_cast<size_t>(o.limit_train), limit_eval = static_cast<size_t>(o.limit_eval);
    if (o.dataset == "fashion-mnist" || o.dataset == "mnist") {
      train_set_ = load_idx_dataset(o.dir, true, limit_train);
      eval_set_ = load_idx_dataset(o.dir, false, limit_eval);
    } else if (o.dataset == "list") {
      if (std::string why = list_datasets_unavailable(); !why.empty()) config_error(cfg, "data.dataset", why);
      if (o.train_list.empty()) config_error(cfg, "data.train_list", "data.dataset = \"list\" needs data.train_list");
      if (o.val_list.empty()) config_error(cfg, "data.val_list", "data.dataset = \"list\" needs data.val_list");
      // With transforms each image keeps its own size until they crop it.
      const int size = cfg.has("data.train.transforms") ? 0 : static_cast<int>(o.image_size);
      const int classes = static_cast<int>(o.num_classes), ch = static_cast<int>(o.channels);
      train_set_ = load_list_dataset(o.train_list, o.root, classes, size, ch, limit_train);
      eval_set_ = load_list_dataset(o.val_list, o.root, classes, size, ch, limit_eval);
    } else {
      config_error(cfg, "data.dataset", "unknown dataset '" + o.dataset + "'; known: fashion-mnist, mnist, list");
    }
    augment_.crop_padding = static_cast<int>(o.crop_padding);
    augment_.flip = o.flip;
    augment_.mean = static_cast<float>(o.mean);
    augment_.std = static_cast<float>(o.std);
    if (!(augment_.std > 0)) config_error(cfg, "augment.std", "must be > 0");
    read_transforms(cfg, Transforms::Flavour::Cls, train_set_->channels(), augment_);
    if (augment_.train_transforms)
      log_line("transforms: train " + augment_.train_transforms->describe() + "; eval " +
               augment_.eval_transforms->describe());

    name_ = o.model;
    width_ = o.width;
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
