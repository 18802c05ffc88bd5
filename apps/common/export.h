#pragma once

#include <functional>
#include <map>
#include <string>

#include <torch/torch.h>

namespace dtrain::apps {

// A trained libtorch C++ module as a TorchScript file that Python's
// torch.jit.load and C++'s torch::jit::load run without dtrain (Paddle's
// tools/export_model.py, for libtorch). The module's parameters and buffers
// become the script module's attributes (names with '.' as '_'); `forward`
// (the app's inference path on a preprocessed batch) is traced once on
// `example`, so the file computes what forward computed for that input's
// shape class (data-dependent control flow is frozen; the apps' models have
// none in eval mode). `extra` is stored beside the code (read with
// torch.jit.load(path, _extra_files=...)): the apps put their preprocessing
// there. The model must be in eval mode; writes `path` atomically.
// s as the inside of a JSON string literal (quotes, backslashes and control characters escaped).
std::string json_escape(const std::string& s);

void save_torchscript(torch::nn::Module& model, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                      const torch::Tensor& example, const std::string& path,
                      const std::map<std::string, std::string>& extra);

}  // namespace dtrain::apps
