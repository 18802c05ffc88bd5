#include "seg/models.h"

#include "common/models.h"
#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"

namespace dtrain::apps {

namespace {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

ConvBnRelu conv_bn_relu(int in, int out, int k = 3, int stride = 1) { return ConvBnRelu(in, out, k, stride); }

torch::Tensor resize_to(const torch::Tensor& x, const torch::Tensor& like) {
  if (x.size(2) == like.size(2) && x.size(3) == like.size(3)) return x;
  return F::interpolate(x, F::InterpolateFuncOptions()
                               .size(std::vector<int64_t>{like.size(2), like.size(3)})
                               .mode(torch::kBilinear)
                               .align_corners(false));
}

torch::Tensor up2(const torch::Tensor& x, const torch::Tensor& like) {
  return F::interpolate(x, F::InterpolateFuncOptions()
                               .size(std::vector<int64_t>{like.size(2), like.size(3)})
                               .mode(torch::kBilinear)
                               .align_corners(false));
}

class UNetImpl : public SegNetImpl {
 public:
  UNetImpl(int base, int depth, int in, int classes) {
    int c = in;
    for (int s = 0; s <= depth; ++s) {
      int out = base << s;
      enc_.push_back(
          register_module("enc" + std::to_string(s), nn::Sequential(conv_bn_relu(c, out), conv_bn_relu(out, out))));
      c = out;
    }
    for (int s = depth - 1; s >= 0; --s) {
      int out = base << s;
      dec_.push_back(register_module("dec" + std::to_string(s),
                                     nn::Sequential(conv_bn_relu(c + out, out), conv_bn_relu(out, out))));
      c = out;
    }
    head_ = register_module("head", nn::Conv2d(nn::Conv2dOptions(c, classes, 1)));
  }
  torch::Tensor forward(torch::Tensor x) override {
    std::vector<torch::Tensor> skips;
    for (size_t s = 0; s < enc_.size(); ++s) {
      if (s > 0) x = F::max_pool2d(x, F::MaxPool2dFuncOptions(2).ceil_mode(true));
      x = run_stage(enc_[s], x);
      skips.push_back(x);
    }
    skips.pop_back();
    for (auto& d : dec_) {
      auto skip = skips.back();
      skips.pop_back();
      x = run_stage(d, torch::cat({up2(x, skip), skip}, 1));
    }
    return head_->forward(x);
  }

 private:
  std::vector<nn::Sequential> enc_, dec_;
  nn::Conv2d head_{nullptr};
};

// PP-LiteSeg's unified attention fusion, spatial variant: the upsampled deep
// feature and the skip are mixed by a per-pixel weight computed from their
// channel means and maxima.
class UafmImpl : public nn::Module {
 public:
  UafmImpl(int skip_ch, int deep_ch, int out) {
    skip_ = register_module("skip", conv_bn_relu(skip_ch, deep_ch));
    att_ =
        register_module("att", nn::Sequential(conv_bn_relu(4, 2), nn::Conv2d(nn::Conv2dOptions(2, 1, 3).padding(1))));
    out_ = register_module("out", conv_bn_relu(deep_ch, out));
  }
  torch::Tensor forward(torch::Tensor skip, torch::Tensor deep) {
    auto s = skip_->forward(skip);
    auto u = up2(deep, s);
    auto stats =
        torch::cat({u.mean(1, true), std::get<0>(u.max(1, true)), s.mean(1, true), std::get<0>(s.max(1, true))}, 1);
    auto a = torch::sigmoid(att_->forward(stats));
    return out_->forward(u * a + s * (1 - a));
  }

 private:
  ConvBnRelu skip_{nullptr}, out_{nullptr};
  nn::Sequential att_{nullptr};
};
TORCH_MODULE(Uafm);

class LiteSegImpl : public SegNetImpl {
 public:
  LiteSegImpl(int base, int blocks, int in, int classes) : backbone_(*this, base, blocks, in) {
    const int c1 = base, c2 = base * 2, c3 = base * 4, c4 = base * 8;
    // Simple pyramid pooling: bins 1, 2, 4, summed, then a 3x3 conv.
    for (int b : {1, 2, 4}) {
      bins_.push_back(b);
      ppm_.push_back(register_module("ppm" + std::to_string(b), conv_bn_relu(c4, c3, 1)));
    }
    ppm_out_ = register_module("ppm_out", conv_bn_relu(c3, c3));
    // Decoder channels shrink towards the high resolution (FLD), down to the
    // stem's 1/2, where the head sits: item boundaries at 64 px need it.
    fuse8_ = register_module("fuse8", Uafm(c3, c3, c2));
    fuse4_ = register_module("fuse4", Uafm(c2, c2, c2));
    fuse2_ = register_module("fuse2", Uafm(c1, c2, c1));
    head_ =
        register_module("head", nn::Sequential(conv_bn_relu(c1, c1), nn::Conv2d(nn::Conv2dOptions(c1, classes, 1))));
  }
  torch::Tensor forward(torch::Tensor x) override {
    auto [f2, f4, f8, f16] = backbone_.forward(x);
    torch::Tensor ctx;
    for (size_t i = 0; i < ppm_.size(); ++i) {
      auto p = F::adaptive_avg_pool2d(f16, F::AdaptiveAvgPool2dFuncOptions({bins_[i], bins_[i]}));
      p = resize_to(ppm_[i]->forward(p), f16);
      ctx = i == 0 ? p : ctx + p;
    }
    ctx = ppm_out_->forward(ctx);
    auto d8 = fuse8_->forward(f8, ctx);
    auto d4 = fuse4_->forward(f4, d8);
    auto d2 = fuse2_->forward(f2, d4);
    return resize_to(head_->forward(d2), x);
  }

 private:
  LiteSegBackbone backbone_;  // stem, stage2, stage3, stage4: a dtrain-cls liteseg checkpoint loads into them
  nn::Sequential head_{nullptr};
  ConvBnRelu ppm_out_{nullptr};
  std::vector<ConvBnRelu> ppm_;
  std::vector<int64_t> bins_;
  Uafm fuse8_{nullptr}, fuse4_{nullptr}, fuse2_{nullptr};
};

}  // namespace

std::vector<std::string> known_seg_models() { return {"unet", "liteseg"}; }

std::shared_ptr<SegNetImpl> make_seg_model(const std::string& name, int base, int depth, int in, int classes) {
  if (base < 1) throw InvalidUsage("model width (base channels) must be >= 1, got " + std::to_string(base));
  if (name == "unet") {
    if (depth < 1 || depth > 6) throw InvalidUsage("unet depth must be in [1, 6], got " + std::to_string(depth));
    return std::make_shared<UNetImpl>(base, depth, in, classes);
  }
  if (name == "liteseg") {
    if (depth < 0 || depth > 8)
      throw InvalidUsage("liteseg depth (residual blocks per deep stage) must be in [0, 8], got " +
                         std::to_string(depth));
    return std::make_shared<LiteSegImpl>(base, depth, in, classes);
  }
  throw InvalidUsage("unknown segmentation model '" + name + "'; known models: " + sdk::join(known_seg_models(), ", "));
}

}  // namespace dtrain::apps
