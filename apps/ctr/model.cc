#include "ctr/model.h"

#include <algorithm>
#include <cmath>

namespace dtrain::apps::ctr {

namespace nn = ::torch::nn;

WideDeepImpl::WideDeepImpl(int64_t embedding_dim, const std::vector<int64_t>& hidden, bool dot_interaction)
    : dot_(dot_interaction) {
  wide_dense_ = register_module("wide_dense", nn::Linear(kDense, 1));
  mlp_ = nn::Sequential();
  int64_t in = kSparse * embedding_dim + kDense;
  if (dot_) {
    std::vector<int64_t> flat;
    for (int64_t i = 0; i < kSparse; ++i)
      for (int64_t j = i + 1; j < kSparse; ++j) flat.push_back(i * kSparse + j);
    pairs_ = ::torch::tensor(flat, ::torch::kLong);
    in += static_cast<int64_t>(flat.size());
    pair_weight_ = register_module("pair_weight", nn::Linear(static_cast<int64_t>(flat.size()), 1));
  }
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
  auto emb = deep_rows.reshape({b, kSparse, -1});
  if (!dot_) return wide + mlp_->forward(::torch::cat({emb.reshape({b, -1}), dense}, 1)).squeeze(1);
  auto dots = ::torch::bmm(emb, emb.transpose(1, 2)).reshape({b, kSparse * kSparse}).index_select(1, pairs_);
  auto deep = mlp_->forward(::torch::cat({emb.reshape({b, -1}), dense, dots}, 1)).squeeze(1);
  return wide + deep + pair_weight_->forward(dots).squeeze(1);
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
