#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>

namespace dtrain::apps {

// Inside namespace dtrain, `torch` would name dtrain::torch (the Fleet API); here it means libtorch.
namespace torch = ::torch;

// Image classifiers by name:
//   resnet20 / resnet32 / resnet56  CIFAR-style ResNet (He et al. 2016, 6n+2 layers,
//                                   stages of 16/32/64 channels times `width`)
//   resnet18 / resnet50             ImageNet-style ResNet (basic / bottleneck blocks,
//                                   64..512 channels times `width`)
// An unknown name throws InvalidUsage listing the known ones.
torch::nn::AnyModule make_model(const std::string& name, double width, int in_channels, int num_classes);
std::vector<std::string> known_models();

}  // namespace dtrain::apps
