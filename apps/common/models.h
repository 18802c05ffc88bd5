#pragma once

#include <array>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "dtrain/fleet/sync_batch_norm.h"

namespace dtrain::apps {

// Image classifiers by name:
//   resnet20 / resnet32 / resnet56  CIFAR-style ResNet (He et al. 2016, 6n+2 layers,
//                                   stages of 16/32/64 channels times `width`)
//   resnet18 / resnet50             ImageNet-style ResNet (basic / bottleneck blocks,
//                                   64..512 channels times `width`)
//   liteseg                         dtrain-seg's liteseg backbone (LiteSegBackbone, base
//                                   24 times `width`, 2 blocks: apps/seg.toml's model),
//                                   global average pool, classifier `fc`: its checkpoint
//                                   starts seg by name ([model] pretrained)
// An unknown name throws InvalidUsage listing the known ones.
torch::nn::AnyModule make_model(const std::string& name, double width, int in_channels, int num_classes);
std::vector<std::string> known_models();

// conv (no bias) + BatchNorm (SyncBatchNorm-capable) + ReLU; "same" padding.
class ConvBnReluImpl : public torch::nn::Module {
 public:
  ConvBnReluImpl(int in, int out, int k, int stride);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::Conv2d conv_{nullptr};
  ::dtrain::fleet::BatchNorm2d bn_{nullptr};
};
TORCH_MODULE(ConvBnRelu);

// PP-LiteSeg-style backbone, one home for dtrain-seg's liteseg and
// dtrain-cls's liteseg classifier, so a cls checkpoint's backbone loads into
// seg by name: a stem (strided conv-BN-ReLU, conv-BN-ReLU: 1/2, `base`
// channels) and stages 2, 3, 4 (a strided conv-BN-ReLU, then ResNet basic
// blocks: 1/4, 1/8, 1/16; base * 2, 4, 8 channels). stage2 has one block
// when blocks > 0, stages 3 and 4 `blocks` each (none: one more conv-BN-ReLU).
// The constructor registers "stem", "stage2", "stage3", "stage4" in `owner`,
// in that order (the initial values follow the order); each stage runs as a
// declared block (dtrain/fleet/blocks.h).
struct LiteSegBackbone {
  LiteSegBackbone(torch::nn::Module& owner, int base, int blocks, int in_channels);
  // The stem's and the stages' outputs: 1/2, 1/4, 1/8, 1/16 of the input.
  std::array<torch::Tensor, 4> forward(const torch::Tensor& x) const;
  int channels(int stage) const { return base << stage; }  // 0: the stem .. 3: stage4
  int base;
  torch::nn::Sequential stem, stage2, stage3, stage4;
};

// Runs `stage` as a declared block (dtrain/fleet/blocks.h), so the strategies
// that act per block (recompute, sharding stage 3) see it.
torch::Tensor run_stage(const torch::nn::Sequential& stage, const torch::Tensor& x);

}  // namespace dtrain::apps
