#pragma once

#include <memory>
#include <string>

#include "common/data.h"

namespace dtrain::apps::ocr {

// CRNN as PaddleOCR's rec_*_none_bilstm_ctc: a convolutional backbone that
// takes [B, C, 32, W] to [B, D, 1, W/4], a bidirectional LSTM over the W/4
// steps, a linear CTC head. forward() returns logits [T, B, classes] (T =
// W/4), the layout ctc_loss takes after log_softmax.
//   backbone "vgg":         plain 3x3 conv/BN/ReLU stages (the default; fast on CPUs)
//   backbone "mobilenetv3": MobileNetV3-small-style inverted residuals with
//                           squeeze-excite and hard-swish, strides (2,1) after the first two
// width scales the backbone's channels; hidden is the LSTM's size per
// direction, layers its depth (PaddleOCR's neck: 2).
struct CrnnImpl : torch::nn::Module {
  CrnnImpl(const std::string& backbone, int channels, int width, int hidden, int layers, int classes);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Sequential backbone{nullptr};
  torch::nn::LSTM rnn{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Crnn);

// InvalidUsage naming the known backbones when `backbone` is not one.
Crnn make_crnn(const std::string& backbone, int channels, int width, int hidden, int layers, int classes);

}  // namespace dtrain::apps::ocr
