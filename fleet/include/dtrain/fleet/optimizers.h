#pragma once
// Large-batch optimizers (Paddle's LAMB and LarsMomentum) and gradient
// clipping by global norm, sharding-aware: under ZeRO sharding each tensor an
// optimizer sees is this rank's zero-padded slice of a real parameter, and the
// layer-wise norms are summed across ranks through a norm reducer.

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include <torch/torch.h>

#include "dtrain/strategy.h"

namespace dtrain::fleet {

// Sums squared norms across ranks in place (an all-reduce Sum of doubles).
// Every rank must call it with a vector of the same length; absent = local.
using NormReducer = std::function<void(std::vector<double>& squared_sums)>;

// The key of a parameter's entry in torch::optim::Optimizer::state(): its
// TensorImpl, as the pointer printed ("0x...") until libtorch 2.x made the
// key the pointer itself. Key is the installed libtorch's; leave it.
using OptimizerStateKey = std::decay_t<decltype(std::declval<::torch::optim::Optimizer&>().state())>::key_type;
template <typename Key = OptimizerStateKey>
Key optimizer_state_key(const ::torch::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << param.unsafeGetTensorImpl();
    return s.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

// What LAMB and LARS share: parameters excluded from weight decay (by tensor
// identity), and a pair of layer-wise norms per parameter summed across ranks
// by the norm reducer in one call per step.
class LayerwiseOptimizer : public ::torch::optim::Optimizer {
 public:
  void set_norm_reducer(NormReducer reducer) { reducer_ = std::move(reducer); }
  // Marks a parameter (by tensor identity) as excluded from weight decay.
  void exclude_from_weight_decay(const ::torch::Tensor& param);
  bool excluded_from_weight_decay(const ::torch::Tensor& param) const;

 protected:
  LayerwiseOptimizer(std::vector<::torch::optim::OptimizerParamGroup> groups,
                     std::unique_ptr<::torch::optim::OptimizerOptions> defaults,
                     const std::vector<::torch::Tensor>& exclude_from_weight_decay);

  // Runs the closure (if any) with gradients on; the step then runs without.
  ::torch::Tensor run_closure(const LossClosure& closure);
  // One entry per parameter with a gradient: `index` its place among every
  // parameter of every group (`count` of them), `pair` the two tensors whose
  // norms it needs. Returns the norms of each pair, summed across ranks: every
  // rank reduces two slots per parameter, with a gradient or not.
  struct NormPair {
    size_t index;
    ::torch::Tensor a, b;
  };
  std::vector<std::pair<double, double>> pair_norms(const std::vector<NormPair>& pairs, size_t count) const;
  // libtorch's load restores the per-parameter state only; this also restores
  // each group's options (lr...) from the same archive.
  template <typename State, typename Options>
  void load_state_and_options(::torch::serialize::InputArchive& archive) {
    ::torch::optim::serialize<State, Options>(archive, *this);
    ::torch::serialize::InputArchive groups_archive;
    archive.read("param_groups", groups_archive);
    std::vector<std::pair<std::vector<std::string>, std::unique_ptr<::torch::optim::OptimizerOptions>>> saved;
    ::torch::optim::detail::serialize<Options>(groups_archive, saved);
    for (size_t i = 0; i < saved.size() && i < param_groups_.size(); ++i)
      param_groups_[i].set_options(std::move(saved[i].second));
  }

 private:
  std::unordered_set<const void*> excluded_;
  NormReducer reducer_;
};

struct LambOptions : public ::torch::optim::OptimizerCloneableOptions<LambOptions> {
  LambOptions(double lr = 1e-3) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.999;
  TORCH_ARG(double, epsilon) = 1e-6;
  TORCH_ARG(double, lamb_weight_decay) = 0.01;

 public:
  void serialize(::torch::serialize::InputArchive& archive) override;
  void serialize(::torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { lr_ = lr; }
};

struct LambParamState : public ::torch::optim::OptimizerCloneableParamState<LambParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(::torch::Tensor, moment1);
  TORCH_ARG(::torch::Tensor, moment2);

 public:
  void serialize(::torch::serialize::InputArchive& archive) override;
  void serialize(::torch::serialize::OutputArchive& archive) const override;
};

// LAMB as paddle.optimizer.Lamb computes it (its documented update and its
// phi kernel), per parameter tensor w with gradient g, step t from 1:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   r = (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd w
//   trust = ||w|| / ||r|| if both > 0, else 1;   w -= lr * trust * r
// wd is lamb_weight_decay, 0 for a parameter excluded from weight decay (the
// trust ratio still applies, as in Paddle). Parameters without a gradient are
// skipped (every rank must agree on which). Dense gradients only. The norms
// are summed across ranks by the norm reducer (one call per step, carrying
// ||w||^2 and ||r||^2 of every parameter of the optimizer); zero padding stays
// zero as long as epsilon > 0. save()/load() round-trip the state
// (step, moment1, moment2) and, unlike libtorch's own optimizers' load(),
// the groups' options (lr...); load into an optimizer over the same groups.
class Lamb : public LayerwiseOptimizer {
 public:
  explicit Lamb(std::vector<::torch::optim::OptimizerParamGroup> param_groups, LambOptions defaults = {},
                const std::vector<::torch::Tensor>& exclude_from_weight_decay = {});
  explicit Lamb(std::vector<::torch::Tensor> params, LambOptions defaults = {},
                const std::vector<::torch::Tensor>& exclude_from_weight_decay = {});

  ::torch::Tensor step(LossClosure closure = nullptr) override;
  void save(::torch::serialize::OutputArchive& archive) const override;
  void load(::torch::serialize::InputArchive& archive) override;
};

struct LarsOptions : public ::torch::optim::OptimizerCloneableOptions<LarsOptions> {
  LarsOptions(double lr = 1e-3) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(double, momentum) = 0.9;
  TORCH_ARG(double, lars_coeff) = 0.001;
  TORCH_ARG(double, lars_weight_decay) = 0.0005;
  TORCH_ARG(double, epsilon) = 0.0;

 public:
  void serialize(::torch::serialize::InputArchive& archive) override;
  void serialize(::torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { lr_ = lr; }
};

struct LarsParamState : public ::torch::optim::OptimizerCloneableParamState<LarsParamState> {
  TORCH_ARG(::torch::Tensor, velocity);

 public:
  void serialize(::torch::serialize::InputArchive& archive) override;
  void serialize(::torch::serialize::OutputArchive& archive) const override;
};

// LARS momentum as Paddle's lars_momentum kernel computes it (phi CPU kernel),
// per parameter tensor w with gradient g:
//   local_lr = lr * lars_coeff * ||w|| / (||g|| + wd ||w|| + epsilon)
//              if wd > 0 and ||w|| > 0 and ||g|| > 0, else lr
//   v = momentum v + local_lr (g + wd w);  w -= v     (v starts at 0)
// wd is lars_weight_decay, 0 for a parameter excluded from weight decay, which
// then gets plain momentum with lr (Paddle's behaviour). Parameters without a
// gradient are skipped (every rank must agree on which). The norms are summed
// across ranks by the norm reducer (one call per step carrying ||w||^2 and
// ||g||^2 of every parameter); zero padding stays zero. save()/load() as
// Lamb's (velocity, and the groups' options).
class Lars : public LayerwiseOptimizer {
 public:
  explicit Lars(std::vector<::torch::optim::OptimizerParamGroup> param_groups, LarsOptions defaults = {},
                const std::vector<::torch::Tensor>& exclude_from_weight_decay = {});
  explicit Lars(std::vector<::torch::Tensor> params, LarsOptions defaults = {},
                const std::vector<::torch::Tensor>& exclude_from_weight_decay = {});

  ::torch::Tensor step(LossClosure closure = nullptr) override;
  void save(::torch::serialize::OutputArchive& archive) const override;
  void load(::torch::serialize::InputArchive& archive) override;
};

// Paddle's lamb / lars meta-optimizers (fleet strategy.lamb, strategy.lars):
//  - s.lamb: `inner` must be a ::torch::optim::Adam (else InvalidUsage
//    "strategy.lamb replaces an Adam optimizer; got ..."). Returns a Lamb over
//    the same parameter groups with each group's Adam lr, betas and eps (Paddle
//    passes the Adam's epsilon), s.lamb_weight_decay, and parameters whose
//    name contains one of s.lamb_exclude_from_weight_decay excluded.
//  - s.lars: `inner` must be a ::torch::optim::SGD with momentum > 0 (Paddle's
//    Momentum; else InvalidUsage). Returns a Lars with each group's SGD lr and
//    momentum, s.lars_coeff, s.lars_weight_decay, s.lars_epsilon, and names
//    containing one of s.lars_exclude_from_weight_decay excluded. SGD's
//    dampening, nesterov and weight_decay are not carried over.
//  - neither: returns `inner`. Both: InvalidUsage.
// The inner optimizer's state is not carried over. name_of gives a
// parameter's name (e.g. from named_parameters()); may be empty when there are
// no exclusions.
std::shared_ptr<::torch::optim::Optimizer> apply_optimizer_strategy(
    std::shared_ptr<::torch::optim::Optimizer> inner, const StrategyOptions& s,
    const std::function<std::string(const ::torch::Tensor&)>& name_of);

// Paddle's ClipGradByGlobalNorm: global_norm = sqrt(sum over params of
// ||grad||^2), the squared sum first summed across ranks by `reduce` when
// given (sharded gradients: each rank holds a slice); then every gradient is
// multiplied by max_norm / max(global_norm, max_norm), i.e. scaled only when
// global_norm > max_norm. Parameters without a gradient are skipped. Returns
// the global norm before clipping; a non-finite norm is returned and the
// gradients are left as they are. Every rank must call it (collective when
// `reduce` is).
double clip_grad_global_norm(const std::vector<::torch::Tensor>& params, double max_norm,
                             const NormReducer& reduce = {});

}  // namespace dtrain::fleet
