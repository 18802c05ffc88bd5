#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "ctr/criteo.h"

namespace dtrain::apps::ctr {

// Wide & deep as in Paddle's Fleet CTR example, without its embeddings (they
// are SparseEmbedding modules on the servers, looked up by the caller):
//   wide: sum over slots of the slot value's 1-dim weight + a linear map of
//         the dense features;
//   deep: the slots' embeddings concatenated with the dense features, then
//         an MLP (ReLU) to one logit. With interaction = "dot" the MLP also
//         gets the dot products of every pair of slot embeddings (325 of
//         them, as DLRM's interaction layer), and a linear map of those dot
//         products adds to the logit (a field-weighted factorization
//         machine): pairwise feature crosses, which an MLP over concatenated
//         embeddings learns poorly.
// forward returns the logit (sigmoid(logit) is the click probability).
class WideDeepImpl : public ::torch::nn::Module {
 public:
  WideDeepImpl(int64_t embedding_dim, const std::vector<int64_t>& hidden, bool dot_interaction = false);
  // wide_rows [B, 26, 1], deep_rows [B, 26, dim], dense [B, 13]
  ::torch::Tensor forward(const ::torch::Tensor& wide_rows, const ::torch::Tensor& deep_rows,
                          const ::torch::Tensor& dense);

 private:
  ::torch::nn::Linear wide_dense_{nullptr};
  ::torch::nn::Linear pair_weight_{nullptr};  // interaction = "dot": one weight per slot pair
  ::torch::nn::Sequential mlp_{nullptr};
  bool dot_ = false;
};

class WideDeep : public ::torch::nn::ModuleHolder<WideDeepImpl> {
 public:
  using ::torch::nn::ModuleHolder<WideDeepImpl>::ModuleHolder;
};

// The dot products of every (i < j) pair of slot embeddings: emb [B, S, D]
// float32 -> [B, S (S - 1) / 2], pairs in (0,1), (0,2), ..., (1,2), ...
// order; differentiable (the backward gives emb's gradient).
::torch::Tensor pair_dots(const ::torch::Tensor& emb);

// Evaluation counters of one pass: log loss sums and AUC buckets.
struct EvalStats {
  explicit EvalStats(size_t buckets = 1 << 14) : pos(buckets, 0.0), neg(buckets, 0.0) {}
  std::vector<double> pos, neg;
  double loss_sum = 0, count = 0;
  void add(const float* probs, const float* labels, size_t n);
};

}  // namespace dtrain::apps::ctr
