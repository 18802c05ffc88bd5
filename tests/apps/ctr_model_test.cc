// The CTR model's pair interaction against the same products made with
// torch::bmm and autograd: values and the embeddings' gradient.
#include <gtest/gtest.h>

#include "ctr/model.h"

namespace dtrain::apps::ctr {
namespace ctr_model_test {

::torch::Tensor reference(const ::torch::Tensor& emb) {
  const int64_t b = emb.size(0), s = emb.size(1);
  std::vector<int64_t> flat;
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = i + 1; j < s; ++j) flat.push_back(i * s + j);
  return ::torch::bmm(emb, emb.transpose(1, 2)).reshape({b, s * s}).index_select(1, ::torch::tensor(flat));
}

TEST(CtrModel, PairDotsMatchBmmForwardAndBackward) {
  ::torch::manual_seed(7);
  for (auto shape : std::vector<std::vector<int64_t>>{{37, 26, 8}, {32, 3, 5}, {5, 26, 8}, {1, 2, 1}, {0, 26, 8}}) {
    auto e0 = ::torch::randn(shape);
    auto a = e0.clone().requires_grad_(), b = e0.clone().requires_grad_();
    auto ya = pair_dots(a), yb = reference(b);
    ASSERT_EQ(ya.sizes(), yb.sizes());
    EXPECT_TRUE(::torch::allclose(ya, yb, 1e-5, 1e-5));
    auto w = ::torch::randn(yb.sizes());
    (ya * w).sum().backward();
    (yb * w).sum().backward();
    EXPECT_TRUE(::torch::allclose(a.grad(), b.grad(), 1e-5, 1e-5)) << (a.grad() - b.grad()).abs().max();
  }
}

TEST(CtrModel, PairDotsRefusesOtherTypes) {
  EXPECT_THROW(pair_dots(::torch::zeros({2, 3, 4}, ::torch::kDouble)), c10::Error);
}

}  // namespace ctr_model_test
}  // namespace dtrain::apps::ctr
