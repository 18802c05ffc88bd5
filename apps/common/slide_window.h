#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <torch/torch.h>

namespace dtrain::apps {

// Evaluation at full resolution as PaddleSeg's test_config (is_slide,
// crop_size, stride): windows of crop_size moved by stride over the image,
// each window's logits added where it lies and every pixel divided by the
// number of windows covering it.

// One window: rows [y1, y2), columns [x1, x2).
struct Window {
  int64_t y1 = 0, x1 = 0, y2 = 0, x2 = 0;
};

// PaddleSeg's slide_inference positions for an h x w image: rows =
// ceil((h - crop_h) / stride_h) + 1 (1 when h <= crop_h), the same for
// columns; window (r, c) starts at (r * stride_h, c * stride_w), is cut at the
// image's edge and then moved back to keep crop size where the image allows.
// Every pixel is covered when stride <= crop. InvalidUsage for sizes < 1.
std::vector<Window> slide_windows(int64_t h, int64_t w, int64_t crop_w, int64_t crop_h, int64_t stride_w,
                                  int64_t stride_h);

// The logits of `images` [B, C, H, W] by windows: forward(window batch
// [B, C, h, w]) must return logits [B, K, h, w]; the result is [B, K, H, W],
// float32, each pixel the mean over the windows covering it.
torch::Tensor slide_inference(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                              const torch::Tensor& images, int64_t crop_w, int64_t crop_h, int64_t stride_w,
                              int64_t stride_h);

}  // namespace dtrain::apps
