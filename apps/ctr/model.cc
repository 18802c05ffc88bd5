#include "ctr/model.h"

#include <algorithm>
#include <cmath>

namespace dtrain::apps::ctr {

namespace nn = ::torch::nn;

namespace {

// Blocks of 16 examples with restrict pointers: at -O2 GCC vectorizes a loop
// only when its trip count is fixed and nothing may alias.
constexpr int64_t kBlock = 16;

inline void add_products(float* __restrict acc, const float* __restrict a, const float* __restrict b) {
  for (int64_t t = 0; t < kBlock; ++t) acc[t] += a[t] * b[t];
}

inline void add_scaled(float* __restrict y, const float* __restrict w, const float* __restrict x) {
  for (int64_t t = 0; t < kBlock; ++t) y[t] += w[t] * x[t];
}

// torch::bmm on [B, 26, 8] runs one small matrix product per example
// through select() (three per example and step with the backward), ~3x this
// op's time on a CPU: this does the pairs only, in slot-major layout so the
// inner loops run over the batch.
struct PairDots : ::torch::autograd::Function<PairDots> {
  static ::torch::Tensor forward(::torch::autograd::AutogradContext* ctx, const ::torch::Tensor& emb) {
    TORCH_CHECK(emb.scalar_type() == ::torch::kFloat, "PairDots: float32 embeddings expected");
    auto et = emb.permute({1, 2, 0}).contiguous();  // [S, D, B]
    const int64_t S = et.size(0), D = et.size(1), B = et.size(2);
    auto out = ::torch::empty({S * (S - 1) / 2, B}, et.options());
    const float* x = et.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = i + 1; j < S; ++j, o += B) {
        const float* a = x + i * D * B;
        const float* b = x + j * D * B;
        int64_t k = 0;
        for (; k + kBlock <= B; k += kBlock) {
          float acc[kBlock] = {};
          for (int64_t d = 0; d < D; ++d) add_products(acc, a + d * B + k, b + d * B + k);
          std::copy(acc, acc + kBlock, o + k);
        }
        for (; k < B; ++k) {
          float sum = 0;
          for (int64_t d = 0; d < D; ++d) sum += a[d * B + k] * b[d * B + k];
          o[k] = sum;
        }
      }
    ctx->save_for_backward({et});
    return out.t();
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grad) {
    auto et = ctx->get_saved_variables()[0];
    auto g = grad[0].t().contiguous();  // [P, B]
    const int64_t S = et.size(0), D = et.size(1), B = et.size(2);
    auto gt = ::torch::zeros_like(et);
    const float* x = et.data_ptr<float>();
    const float* w = g.data_ptr<float>();
    float* gx = gt.data_ptr<float>();
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = i + 1; j < S; ++j, w += B)
        for (int64_t d = 0; d < D; ++d) {
          const float* a = x + (i * D + d) * B;
          const float* b = x + (j * D + d) * B;
          float* ga = gx + (i * D + d) * B;
          float* gb = gx + (j * D + d) * B;
          int64_t k = 0;
          for (; k + kBlock <= B; k += kBlock) {
            add_scaled(ga + k, w + k, b + k);
            add_scaled(gb + k, w + k, a + k);
          }
          for (; k < B; ++k) {
            ga[k] += w[k] * b[k];
            gb[k] += w[k] * a[k];
          }
        }
    return {gt.permute({2, 0, 1}).contiguous()};
  }
};

}  // namespace

::torch::Tensor pair_dots(const ::torch::Tensor& emb) { return PairDots::apply(emb); }

WideDeepImpl::WideDeepImpl(int64_t embedding_dim, const std::vector<int64_t>& hidden, bool dot_interaction)
    : dot_(dot_interaction) {
  wide_dense_ = register_module("wide_dense", nn::Linear(kDense, 1));
  mlp_ = nn::Sequential();
  int64_t in = kSparse * embedding_dim + kDense;
  if (dot_) {
    const int64_t pairs = kSparse * (kSparse - 1) / 2;
    in += pairs;
    pair_weight_ = register_module("pair_weight", nn::Linear(pairs, 1));
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
  auto dots = pair_dots(emb);
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
