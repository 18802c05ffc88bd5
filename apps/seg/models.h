#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace dtrain::apps {

// A segmentation network: [B, C, H, W] images to [B, classes, H, W] logits,
// for any H and W (inner sizes are matched by interpolation).
class SegNetImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

// Segmentation networks by name:
//   unet      U-Net (Ronneberger et al. 2015): `depth` encoder stages of two
//             3x3 conv-BN-ReLU and a 2x2 max-pool, channels base * 2^stage,
//             a decoder that upsamples (bilinear) and concatenates the skip.
//   liteseg   PP-LiteSeg in small (Peng et al. 2022): a strided conv backbone
//             (1/2, 1/4, 1/8, 1/16; channels base * 1, 2, 4, 8) with `depth`
//             ResNet basic blocks in each of the two deepest stages, a simple
//             pyramid pooling module (bins 1, 2, 4), a flexible lightweight
//             decoder with spatial-attention fusion (UAFM) of the 1/8, 1/4 and
//             1/2 features, the head at 1/2 and a bilinear upsampling to the
//             input size. The backbone is common/models.h's LiteSegBackbone:
//             dtrain-cls's liteseg classifier has the same one, so its
//             checkpoint starts this model ([model] pretrained).
// An unknown name throws InvalidUsage listing the known ones.
std::shared_ptr<SegNetImpl> make_seg_model(const std::string& name, int base, int depth, int in_channels,
                                           int num_classes);
std::vector<std::string> known_seg_models();

}  // namespace dtrain::apps
