#include "ctr/model.h"

#include <algorithm>
#include <cmath>

namespace dtrain::apps::ctr {

namespace nn = ::torch::nn;

WideDeepImpl::WideDeepImpl(int64_t embedding_dim, const std::vector<int64_t>& hidden) {
  wide_dense_ = register_module("wide_dense", nn::Linear(kDense, 1));
  mlp_ = nn::Sequential();
  int64_t in = kSparse * embedding_dim + kDense;
  for (int64_t h : hidden) {
    mlp_->push_back(nn::Linear(in, h));
    mlp_->push_back(nn::ReLU());
    in = h;
  }
  mlp_->push_back(nn::Linear(in, 1));
  register_module("mlp", mlp_);
}

::torch::Tensor WideDeepImpl::forward(const ::torch::Tensor& wide_rows, const ::torch::Tensor& deep_rows,
                                      const ::torch::Tensor& dense) {
  const int64_t b = dense.size(0);
  auto wide = wide_rows.reshape({b, kSparse}).sum(1) + wide_dense_->forward(dense).squeeze(1);
  auto deep = mlp_->forward(::torch::cat({deep_rows.reshape({b, -1}), dense}, 1)).squeeze(1);
  return wide + deep;
}

void EvalStats::add(const float* probs, const float* labels, size_t n) {
  const size_t nb = pos.size();
  for (size_t i = 0; i < n; ++i) {
    const double p = std::clamp<double>(probs[i], 1e-7, 1.0 - 1e-7);
    const size_t bucket = std::min(nb - 1, static_cast<size_t>(p * static_cast<double>(nb)));
    if (labels[i] > 0.5f) {
      pos[bucket] += 1;
      loss_sum -= std::log(p);
    } else {
      neg[bucket] += 1;
      loss_sum -= std::log(1.0 - p);
    }
  }
  count += static_cast<double>(n);
}

}  // namespace dtrain::apps::ctr
