#include "ocr/models.h"

#include "dtrain/error.h"
#include "dtrain/fleet/sync_batch_norm.h"

namespace dtrain::apps::ocr {

namespace nn = torch::nn;

namespace {

using Pair = torch::ExpandingArray<2>;

struct ConvBnImpl : nn::Module {
  ConvBnImpl(int in, int out, Pair k, Pair stride, Pair pad, int groups) {
    conv = register_module(
        "conv", nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(pad).groups(groups).bias(false)));
    bn = register_module("bn", dtrain::fleet::BatchNorm2d(out));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn(conv(x)); }
  nn::Conv2d conv{nullptr};
  dtrain::fleet::BatchNorm2d bn{nullptr};  // SyncBatchNorm-capable (strategy.sync_batch_norm)
};
TORCH_MODULE(ConvBn);

ConvBn conv_bn(int in, int out, Pair k, Pair stride, Pair pad, int groups = 1) {
  return ConvBn(in, out, k, stride, pad, groups);
}

// Plain VGG-style stages: [B, C, 32, W] -> [B, 4w, 1, W/4].
nn::Sequential vgg(int c, int w) {
  nn::Sequential s;
  auto stage = [&](int in, int out) {
    s->push_back(conv_bn(in, out, 3, 1, 1));
    s->push_back(nn::ReLU(nn::ReLUOptions(true)));
  };
  stage(c, w);
  s->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(2).stride(2)));  // 16 x W/2
  stage(w, 2 * w);
  s->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(2).stride(2)));  // 8 x W/4
  stage(2 * w, 3 * w);
  stage(3 * w, 3 * w);
  s->push_back(nn::MaxPool2d(nn::MaxPool2dOptions({2, 1}).stride({2, 1})));  // 4 x W/4
  stage(3 * w, 4 * w);
  s->push_back(nn::MaxPool2d(nn::MaxPool2dOptions({2, 1}).stride({2, 1})));  // 2 x W/4
  s->push_back(conv_bn(4 * w, 4 * w, Pair({2, 1}), 1, 0));                   // 1 x W/4
  s->push_back(nn::ReLU(nn::ReLUOptions(true)));
  return s;
}

struct SqueezeExciteImpl : nn::Module {
  explicit SqueezeExciteImpl(int c) {
    int r = std::max(8, c / 4);
    fc1 = register_module("fc1", nn::Conv2d(nn::Conv2dOptions(c, r, 1)));
    fc2 = register_module("fc2", nn::Conv2d(nn::Conv2dOptions(r, c, 1)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto s = torch::adaptive_avg_pool2d(x, {1, 1});
    s = torch::hardsigmoid(fc2(torch::relu(fc1(s))));
    return x * s;
  }
  nn::Conv2d fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(SqueezeExcite);

struct HardSwishImpl : nn::Module {
  torch::Tensor forward(const torch::Tensor& x) { return torch::hardswish(x); }
};
TORCH_MODULE(HardSwish);

// MobileNetV3's inverted residual: expand 1x1, depthwise kxk (stride), SE, project 1x1.
struct InvertedResidualImpl : nn::Module {
  InvertedResidualImpl(int in, int mid, int out, int k, std::vector<int64_t> stride, bool se, bool hswish)
      : residual(in == out && stride[0] == 1 && stride[1] == 1), hs(hswish) {
    expand = register_module("expand", conv_bn(in, mid, 1, 1, 0));
    dw = register_module("dw", conv_bn(mid, mid, k, Pair({stride[0], stride[1]}), k / 2, mid));
    if (se) this->se = register_module("se", SqueezeExcite(mid));
    project = register_module("project", conv_bn(mid, out, 1, 1, 0));
  }
  torch::Tensor act(const torch::Tensor& x) const { return hs ? torch::hardswish(x) : torch::relu(x); }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = act(expand->forward(x));
    y = act(dw->forward(y));
    if (se) y = se->forward(y);
    y = project->forward(y);
    return residual ? x + y : y;
  }
  bool residual, hs;
  ConvBn expand{nullptr}, dw{nullptr}, project{nullptr};
  SqueezeExcite se{nullptr};
};
TORCH_MODULE(InvertedResidual);

// [B, C, 32, W] -> [B, 6w, 1, W/4]: strides (2,2), (2,2) then (2,1) twice, as
// PaddleOCR's MobileNetV3 for recognition keeps the width.
nn::Sequential mobilenet(int c, int w) {
  nn::Sequential s;
  s->push_back(conv_bn(c, w, 3, 2, 1));  // 16 x W/2
  s->push_back(HardSwish());
  s->push_back(InvertedResidual(w, w, w, 3, std::vector<int64_t>{2, 2}, true, false));               // 8 x W/4
  s->push_back(InvertedResidual(w, 3 * w, 3 * w / 2, 3, std::vector<int64_t>{2, 1}, false, false));  // 4 x W/4
  s->push_back(InvertedResidual(3 * w / 2, 4 * w, 3 * w / 2, 3, std::vector<int64_t>{1, 1}, false, false));
  s->push_back(InvertedResidual(3 * w / 2, 6 * w, 5 * w / 2, 5, std::vector<int64_t>{2, 1}, true, true));  // 2 x W/4
  s->push_back(InvertedResidual(5 * w / 2, 8 * w, 5 * w / 2, 5, std::vector<int64_t>{1, 1}, true, true));
  s->push_back(InvertedResidual(5 * w / 2, 8 * w, 3 * w, 5, std::vector<int64_t>{1, 1}, true, true));
  s->push_back(conv_bn(3 * w, 6 * w, 1, 1, 0));
  s->push_back(HardSwish());
  s->push_back(nn::MaxPool2d(nn::MaxPool2dOptions({2, 1}).stride({2, 1})));  // 1 x W/4
  return s;
}

int backbone_channels(const std::string& name, int w) { return name == "vgg" ? 4 * w : 6 * w; }

}  // namespace

CrnnImpl::CrnnImpl(const std::string& name, int channels, int width, int hidden, int layers, int classes) {
  backbone = register_module("backbone", name == "vgg" ? vgg(channels, width) : mobilenet(channels, width));
  rnn = register_module(
      "rnn", nn::LSTM(nn::LSTMOptions(backbone_channels(name, width), hidden).num_layers(layers).bidirectional(true)));
  head = register_module("head", nn::Linear(2 * hidden, classes));
}

torch::Tensor CrnnImpl::forward(const torch::Tensor& x) {
  auto f = backbone->forward(x);                            // [B, D, 1, T]
  auto seq = f.squeeze(2).permute({2, 0, 1}).contiguous();  // [T, B, D]
  // The zero initial state made from the input by tensor ops, not from its
  // size as a number: export_model's trace then keeps the batch size free.
  const auto& o = rnn->options;
  auto h0 = seq.select(0, 0).narrow(1, 0, 1).mul(0).expand({-1, o.hidden_size()});  // [B, H]
  h0 = h0.unsqueeze(0).repeat({o.num_layers() * (o.bidirectional() ? 2 : 1), 1, 1}).contiguous();
  auto out = std::get<0>(rnn->forward(seq, std::make_tuple(h0, h0.clone())));  // [T, B, 2H]
  return head->forward(out);                                                   // [T, B, classes]
}

Crnn make_crnn(const std::string& backbone, int channels, int width, int hidden, int layers, int classes) {
  if (backbone != "vgg" && backbone != "mobilenetv3")
    throw InvalidUsage("unknown backbone '" + backbone + "'; known backbones: vgg, mobilenetv3");
  if (width < 4 || hidden < 1 || layers < 1)
    throw InvalidUsage("model.width must be >= 4, model.hidden and model.layers >= 1");
  return Crnn(backbone, channels, width, hidden, layers, classes);
}

}  // namespace dtrain::apps::ocr
