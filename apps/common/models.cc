#include "common/models.h"

#include <cmath>
#include <string>
#include <vector>

#include "dtrain/error.h"
#include "dtrain/fleet/blocks.h"
#include "dtrain/fleet/sync_batch_norm.h"

namespace nn = torch::nn;
// SyncBatchNorm-capable, with torch::nn::BatchNorm2d's parameters and buffers.
using BatchNorm2d = dtrain::fleet::BatchNorm2d;

namespace dtrain::apps {

namespace {

nn::Conv2d conv(int in, int out, int k, int stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).bias(false));
}

// A residual block: conv_k -> bn_k for each layer (ReLU between them), plus
// the input (through a 1x1 conv and bn where the shape changes), then ReLU.
// Modules are named conv1, bn1, ..., downsample, as torchvision's blocks.
struct ResidualImpl : nn::Module {
  struct Layer {
    int in, out, kernel, stride;
  };
  explicit ResidualImpl(const std::vector<Layer>& layers) {
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& l = layers[i];
      convs.push_back(register_module("conv" + std::to_string(i + 1), conv(l.in, l.out, l.kernel, l.stride)));
      bns.push_back(register_module("bn" + std::to_string(i + 1), BatchNorm2d(l.out)));
    }
    const int in = layers.front().in, out = layers.back().out;
    int stride = 1;
    for (const Layer& l : layers) stride *= l.stride;
    if (stride != 1 || in != out)
      down = register_module("downsample", nn::Sequential(conv(in, out, 1, stride), BatchNorm2d(out)));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto y = x;
    for (size_t i = 0; i < convs.size(); ++i) {
      y = bns[i](convs[i](y));
      if (i + 1 < convs.size()) y = torch::relu(y);
    }
    return torch::relu(y + (down ? down->forward(x) : x));
  }
  std::vector<nn::Conv2d> convs;
  std::vector<BatchNorm2d> bns;
  nn::Sequential down{nullptr};
};
TORCH_MODULE(Residual);

// ResNet's basic block (two 3x3 convolutions) and bottleneck (1x1, 3x3, 1x1 to 4 x mid).
Residual BasicBlock(int in, int out, int stride) {
  return Residual(std::vector<ResidualImpl::Layer>{{in, out, 3, stride}, {out, out, 3, 1}});
}
Residual Bottleneck(int in, int mid, int stride) {
  return Residual(std::vector<ResidualImpl::Layer>{{in, mid, 1, 1}, {mid, mid, 3, stride}, {mid, mid * 4, 1, 1}});
}

// apps/seg.toml's liteseg: width 24, depth 2.
constexpr int kLiteSegBase = 24, kLiteSegBlocks = 2;

int scaled(int c, double width) { return std::max(1, static_cast<int>(std::lround(c * width))); }

void init_weights(nn::Module& m) {
  for (auto& mod : m.modules(/*include_self=*/false)) {
    if (auto* c = mod->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* b = mod->as<BatchNorm2d>()) {
      nn::init::ones_(b->weight);
      nn::init::zeros_(b->bias);
    }
  }
}

// stem conv + BN + ReLU (+ 3x3 max-pool for ImageNet-style inputs), residual
// blocks, global average pool, classifier.
struct ResNetImpl : nn::Module {
  ResNetImpl(nn::Conv2d stem_conv, int stem_channels, bool stem_pool, nn::Sequential body, int out_channels,
             int classes)
      : stem_pool(stem_pool) {
    stem = register_module("stem", stem_conv);
    bn = register_module("bn", BatchNorm2d(stem_channels));
    blocks = register_module("blocks", body);
    fc = register_module("fc", nn::Linear(out_channels, classes));
    init_weights(*this);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn(stem(x)));
    if (stem_pool) x = torch::max_pool2d(x, 3, 2, 1);
    // Each residual block is a declared block (dtrain/fleet/blocks.h): the
    // strategies that act per block (recompute, sharding stage 3) see it.
    for (auto& m : *blocks) {
      auto* block = &m;
      x = dtrain::fleet::run_block(
          *m.ptr(), [block](const torch::Tensor& t) { return block->forward(t); }, x);
    }
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    // The classifier is a block too: sharding stage 3 frees it between uses (2M of ResNet-50's 25.6M).
    return dtrain::fleet::run_block(
        *fc, [this](const torch::Tensor& t) { return fc(t); }, x);
  }
  bool stem_pool;
  nn::Conv2d stem{nullptr};
  BatchNorm2d bn{nullptr};
  nn::Sequential blocks{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

ResNet cifar_resnet(int depth, double width, int in_ch, int classes) {
  int n = (depth - 2) / 6;
  int c1 = scaled(16, width), c2 = scaled(32, width), c3 = scaled(64, width);
  auto stem = conv(in_ch, c1, 3, 1);
  nn::Sequential blocks;
  int in = c1, s = 1;
  for (int out : {c1, c2, c3}) {
    for (int i = 0; i < n; ++i) {
      blocks->push_back(BasicBlock(in, out, i == 0 ? s : 1));
      in = out;
    }
    s = 2;
  }
  return ResNet(stem, c1, false, blocks, in, classes);
}

ResNet imagenet_resnet(bool bottleneck, const std::vector<int>& layers, double width, int in_ch, int classes) {
  int c = scaled(64, width);
  nn::Conv2d stem(nn::Conv2dOptions(in_ch, c, 7).stride(2).padding(3).bias(false));
  nn::Sequential blocks;
  int in = c;
  for (size_t stage = 0; stage < layers.size(); ++stage) {
    int mid = scaled(64 << stage, width);
    for (int i = 0; i < layers[stage]; ++i) {
      int stride = (i == 0 && stage > 0) ? 2 : 1;
      if (bottleneck) {
        blocks->push_back(Bottleneck(in, mid, stride));
        in = mid * 4;
      } else {
        blocks->push_back(BasicBlock(in, mid, stride));
        in = mid;
      }
    }
  }
  return ResNet(stem, c, true, blocks, in, classes);
}

// ResNet's basic block as dtrain-seg's liteseg has it: two 3x3 conv-BN, the
// input added before the last ReLU, the channels kept.
class LiteBlockImpl : public nn::Module {
 public:
  explicit LiteBlockImpl(int ch) {
    a_ = register_module("a", ConvBnRelu(ch, ch, 3, 1));
    conv_ = register_module("conv", nn::Conv2d(nn::Conv2dOptions(ch, ch, 3).padding(1).bias(false)));
    bn_ = register_module("bn", BatchNorm2d(ch));
  }
  torch::Tensor forward(torch::Tensor x) { return torch::relu(x + bn_->forward(conv_->forward(a_->forward(x)))); }

 private:
  ConvBnRelu a_{nullptr};
  nn::Conv2d conv_{nullptr};
  BatchNorm2d bn_{nullptr};
};
TORCH_MODULE(LiteBlock);

nn::Sequential lite_stage(int in, int out, int blocks) {
  nn::Sequential s(ConvBnRelu(in, out, 3, 2));
  if (blocks == 0) s->push_back(ConvBnRelu(out, out, 3, 1));
  for (int i = 0; i < blocks; ++i) s->push_back(LiteBlock(out));
  return s;
}

struct LiteSegClassifierImpl : nn::Module {
  LiteSegClassifierImpl(int base, int blocks, int in, int classes) : backbone(*this, base, blocks, in) {
    fc = register_module("fc", nn::Linear(backbone.channels(3), classes));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto f16 = backbone.forward(x)[3];
    return fc(torch::adaptive_avg_pool2d(f16, {1, 1}).flatten(1));
  }
  LiteSegBackbone backbone;
  nn::Linear fc{nullptr};
};
TORCH_MODULE(LiteSegClassifier);

}  // namespace

ConvBnReluImpl::ConvBnReluImpl(int in, int out, int k, int stride) {
  conv_ = register_module("conv", nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).bias(false)));
  bn_ = register_module("bn", BatchNorm2d(out));
}

torch::Tensor ConvBnReluImpl::forward(torch::Tensor x) { return torch::relu(bn_->forward(conv_->forward(x))); }

torch::Tensor run_stage(const nn::Sequential& stage, const torch::Tensor& x) {
  auto s = stage.ptr();
  return dtrain::fleet::run_block(
      *s, [s](const torch::Tensor& t) { return s->forward(t); }, x);
}

LiteSegBackbone::LiteSegBackbone(nn::Module& owner, int base, int blocks, int in) : base(base) {
  stem = owner.register_module("stem", nn::Sequential(ConvBnRelu(in, base, 3, 2), ConvBnRelu(base, base, 3, 1)));
  stage2 = owner.register_module("stage2", lite_stage(base, base * 2, blocks > 0 ? 1 : 0));
  stage3 = owner.register_module("stage3", lite_stage(base * 2, base * 4, blocks));
  stage4 = owner.register_module("stage4", lite_stage(base * 4, base * 8, blocks));
}

std::array<torch::Tensor, 4> LiteSegBackbone::forward(const torch::Tensor& x) const {
  auto f2 = run_stage(stem, x);
  auto f4 = run_stage(stage2, f2);
  auto f8 = run_stage(stage3, f4);
  return {f2, f4, f8, run_stage(stage4, f8)};
}

std::vector<std::string> known_models() {
  return {"resnet20", "resnet32", "resnet56", "resnet18", "resnet50", "liteseg"};
}

torch::nn::AnyModule make_model(const std::string& name, double width, int in_channels, int num_classes) {
  if (!(width > 0)) throw InvalidUsage("model.width must be > 0");
  if (name == "resnet20") return nn::AnyModule(cifar_resnet(20, width, in_channels, num_classes));
  if (name == "resnet32") return nn::AnyModule(cifar_resnet(32, width, in_channels, num_classes));
  if (name == "resnet56") return nn::AnyModule(cifar_resnet(56, width, in_channels, num_classes));
  if (name == "resnet18") return nn::AnyModule(imagenet_resnet(false, {2, 2, 2, 2}, width, in_channels, num_classes));
  if (name == "resnet50") return nn::AnyModule(imagenet_resnet(true, {3, 4, 6, 3}, width, in_channels, num_classes));
  if (name == "liteseg")
    return nn::AnyModule(LiteSegClassifier(scaled(kLiteSegBase, width), kLiteSegBlocks, in_channels, num_classes));
  std::string known;
  for (auto& k : known_models()) known += (known.empty() ? "" : ", ") + k;
  throw InvalidUsage("unknown model '" + name + "'; known models: " + known);
}

}  // namespace dtrain::apps
