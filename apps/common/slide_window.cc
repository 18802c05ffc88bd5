#include "common/slide_window.h"

#include <algorithm>
#include <string>

#include "dtrain/error.h"

namespace dtrain::apps {

std::vector<Window> slide_windows(int64_t h, int64_t w, int64_t crop_w, int64_t crop_h, int64_t stride_w,
                                  int64_t stride_h) {
  if (h < 1 || w < 1 || crop_w < 1 || crop_h < 1 || stride_w < 1 || stride_h < 1)
    throw InvalidUsage("slide_windows: image, crop and stride sizes must be >= 1");
  auto count = [](int64_t n, int64_t crop, int64_t stride) {
    return n <= crop ? int64_t{1} : (n - crop + stride - 1) / stride + 1;
  };
  const int64_t rows = count(h, crop_h, stride_h), cols = count(w, crop_w, stride_w);
  std::vector<Window> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      Window win;
      win.y2 = std::min(r * stride_h + crop_h, h);
      win.x2 = std::min(c * stride_w + crop_w, w);
      win.y1 = std::max<int64_t>(win.y2 - crop_h, 0);
      win.x1 = std::max<int64_t>(win.x2 - crop_w, 0);
      out.push_back(win);
    }
  return out;
}

torch::Tensor slide_inference(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                              const torch::Tensor& images, int64_t crop_w, int64_t crop_h, int64_t stride_w,
                              int64_t stride_h) {
  using torch::indexing::Slice;
  const int64_t H = images.size(2), W = images.size(3);
  torch::Tensor sum, count = torch::zeros({1, 1, H, W}, images.options().dtype(torch::kFloat32));
  for (const Window& win : slide_windows(H, W, crop_w, crop_h, stride_w, stride_h)) {
    auto logits = forward(images.index({Slice(), Slice(), Slice(win.y1, win.y2), Slice(win.x1, win.x2)}).contiguous())
                      .to(torch::kFloat32);
    if (!sum.defined()) sum = torch::zeros({images.size(0), logits.size(1), H, W}, logits.options());
    sum.index({Slice(), Slice(), Slice(win.y1, win.y2), Slice(win.x1, win.x2)}).add_(logits);
    count.index({Slice(), Slice(), Slice(win.y1, win.y2), Slice(win.x1, win.x2)}).add_(1);
  }
  return sum / count;
}

}  // namespace dtrain::apps
