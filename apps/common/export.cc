#include "common/export.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/script.h>

#include "common/trainer.h"
#include "common/transforms.h"
#include "dtrain/error.h"

namespace fs = std::filesystem;

namespace dtrain::apps {

std::string json_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

void save_torchscript(torch::nn::Module& model, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                      const torch::Tensor& example, const std::string& path,
                      const std::map<std::string, std::string>& extra) {
  if (model.is_training()) throw InvalidUsage("save_torchscript: put the model in eval mode first");
  torch::jit::Module script("dtrain_model");
  auto flat = [](std::string n) {
    std::replace(n.begin(), n.end(), '.', '_');
    return n;
  };
  for (auto& kv : model.named_parameters()) script.register_parameter(flat(kv.key()), kv.value(), false);
  for (auto& kv : model.named_buffers()) script.register_buffer(flat(kv.key()), kv.value());
  torch::NoGradGuard ng;
  auto traced = torch::jit::tracer::trace(
      {example}, [&](torch::jit::Stack in) -> torch::jit::Stack { return {forward(in[0].toTensor())}; },
      [](const torch::autograd::Variable&) { return std::string(); }, /*strict=*/true, /*force_outplace=*/false,
      &script);
  auto fn = script._ivalue()->compilation_unit()->create_function(c10::QualifiedName(*script.type()->name(), "forward"),
                                                                  traced.first->graph);
  script.type()->addMethod(fn);
  torch::jit::ExtraFilesMap files(extra.begin(), extra.end());
  const std::string tmp = path + ".tmp";
  if (std::filesystem::path(path).has_parent_path())
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  script.save(tmp, files);
  std::filesystem::rename(tmp, path);
}

torch::Tensor Trainer::infer(const torch::Tensor&) {
  throw NotSupported("dtrain-" + app_ + " has no export_model yet");
}

std::string Trainer::preprocessing_json() const { throw NotSupported("dtrain-" + app_ + " has no export_model yet"); }

std::string Trainer::input_json(const std::string& what) const {
  const int c = eval_set_->channels();
  if (const auto& t = augment_.eval_transforms)
    return fmt::format(
        "\"input\": \"float32 [N, {}, H, W]{}: {}; then pixels * scale, then (x - mean) / std per channel\", "
        "\"scale\": {}, \"mean\": [{}], \"std\": [{}]",
        c, what, json_escape(t->describe()), t->scale(), fmt::join(t->mean(), ", "), fmt::join(t->stddev(), ", "));
  return fmt::format(
      "\"input\": \"float32 [N, {}, H, W]{}: pixels / 255, then (x - mean) / std\", \"mean\": {}, "
      "\"std\": {}",
      c, what, augment_.mean, augment_.std);
}

void Trainer::export_model(const std::string& output, const std::string& verify_dir, int64_t batch) {
  opts_ = trainer_table().read(cfg_);
  torch::manual_seed(static_cast<uint64_t>(opts_.seed));
  seed_ = static_cast<uint64_t>(opts_.seed);
  build();
  model_->to(torch::kCPU);
  ckpt_dir_ = cfg_.get_string("checkpoint.dir");
  std::string path = opts_.resume;
  if (path == "false" || path == "true" || path.empty()) path = (fs::path(ckpt_dir_) / "latest.pt").string();
  if (!fs::exists(path)) path = latest_sharded_checkpoint(ckpt_dir_);
  if (path.empty() || !fs::exists(path))
    config_error(cfg_, "checkpoint.dir",
                 "export_model found no checkpoint: no " + (fs::path(ckpt_dir_) / "latest.pt").string() +
                     " and no sharded one (train first, or name one with checkpoint.resume)");
  // The optimizer's part of the checkpoint is read into a throwaway one.
  torch::optim::SGD scratch(model_->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  if (fs::is_directory(path)) {
    auto ars = read_shard_archives(path);
    load_shards_whole(ars, *model_, scratch);
  } else {
    load_model_weights(path, ckpt_dir_, *model_);
  }
  model_->eval();
  std::vector<size_t> idx;
  for (size_t i = 0; i < std::min<size_t>(static_cast<size_t>(std::max<int64_t>(1, batch)), eval_set_->size()); ++i)
    idx.push_back(i);
  BatchLoader loader(eval_set_, idx, static_cast<int64_t>(idx.size()), false, augment_, false, seed_, 0);
  Batch b;
  if (!loader.next(&b)) throw InvalidUsage("export_model: the evaluation set is empty");
  save_torchscript(*model_, [this](const torch::Tensor& x) { return infer(x); }, b.images, output,
                   {{"preprocessing.json", preprocessing_json()}});
  torch::Tensor out;
  {
    torch::NoGradGuard ng;
    out = infer(b.images).contiguous();
  }
  log_line(fmt::format("export_model: {} -> {} (TorchScript; input {} -> output {}; preprocessing.json inside)", path,
                       output, fmt::join(b.images.sizes(), "x"), fmt::join(out.sizes(), "x")));
  if (verify_dir.empty()) return;
  fs::create_directories(verify_dir);
  auto write = [&](const std::string& name, const torch::Tensor& t) {
    auto c = t.to(torch::kFloat).contiguous();
    std::ofstream f((fs::path(verify_dir) / name).string(), std::ios::binary);
    f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * sizeof(float)));
    if (!f) throw IoError("cannot write " + (fs::path(verify_dir) / name).string());
  };
  write("input.f32", b.images);
  write("output.f32", out);
  std::ofstream((fs::path(verify_dir) / "shapes.txt").string())
      << fmt::format("{}\n{}\n", fmt::join(b.images.sizes(), " "), fmt::join(out.sizes(), " "));
}

}  // namespace dtrain::apps
