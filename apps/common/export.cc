#include "common/export.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/script.h>

#include "dtrain/error.h"

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

}  // namespace dtrain::apps
