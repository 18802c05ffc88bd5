#include "dtrain/fleet/optimizers.h"

#include <cmath>
#include <typeinfo>

#include <torch/torch.h>

#include "dtrain/error.h"

namespace dtrain::fleet {

namespace {

using ::torch::Tensor;
using ::torch::optim::OptimizerParamGroup;

// Squared L2 norms of `tensors` (squares in the tensor's dtype, summed in
// double), fetched to the host with one copy.
std::vector<double> squared_sums(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) return {};
  std::vector<Tensor> sums;
  sums.reserve(tensors.size());
  auto device = tensors.front().device();
  for (const auto& t : tensors) sums.push_back(at::sum(t.square(), at::kDouble).to(device));
  auto host = ::torch::stack(sums).to(::torch::kCPU).contiguous();
  const double* p = host.data_ptr<double>();
  return std::vector<double>(p, p + host.numel());
}

void check_grad(const Tensor& g) {
  TORCH_CHECK(!g.is_sparse(), "dtrain::fleet: LAMB/LARS/clipping take dense gradients only");
}

// The state and options archives (libtorch's _TORCH_OPTIM_* macros say
// `torch::`, which inside this namespace names dtrain::fleet).
void put(::torch::serialize::OutputArchive& archive, const char* key, const c10::IValue& value) {
  if (value.isTensor() && !value.toTensor().defined()) return;
  archive.write(key, value);
}

c10::IValue get(::torch::serialize::InputArchive& archive, const char* key) {
  c10::IValue v;
  TORCH_CHECK(archive.try_read(key, v), "optimizer state: missing field ", key);
  return v;
}

Tensor get_tensor(::torch::serialize::InputArchive& archive, const char* key) {
  c10::IValue v;
  return archive.try_read(key, v) ? v.toTensor() : Tensor();
}

}  // namespace

void LambOptions::serialize(::torch::serialize::OutputArchive& archive) const {
  put(archive, "lr", lr());
  put(archive, "beta1", beta1());
  put(archive, "beta2", beta2());
  put(archive, "epsilon", epsilon());
  put(archive, "lamb_weight_decay", lamb_weight_decay());
}

void LambOptions::serialize(::torch::serialize::InputArchive& archive) {
  lr(get(archive, "lr").toDouble());
  beta1(get(archive, "beta1").toDouble());
  beta2(get(archive, "beta2").toDouble());
  epsilon(get(archive, "epsilon").toDouble());
  lamb_weight_decay(get(archive, "lamb_weight_decay").toDouble());
}

void LambParamState::serialize(::torch::serialize::OutputArchive& archive) const {
  put(archive, "step", step());
  put(archive, "moment1", moment1());
  put(archive, "moment2", moment2());
}

void LambParamState::serialize(::torch::serialize::InputArchive& archive) {
  step(get(archive, "step").toInt());
  moment1(get_tensor(archive, "moment1"));
  moment2(get_tensor(archive, "moment2"));
}

void LarsOptions::serialize(::torch::serialize::OutputArchive& archive) const {
  put(archive, "lr", lr());
  put(archive, "momentum", momentum());
  put(archive, "lars_coeff", lars_coeff());
  put(archive, "lars_weight_decay", lars_weight_decay());
  put(archive, "epsilon", epsilon());
}

void LarsOptions::serialize(::torch::serialize::InputArchive& archive) {
  lr(get(archive, "lr").toDouble());
  momentum(get(archive, "momentum").toDouble());
  lars_coeff(get(archive, "lars_coeff").toDouble());
  lars_weight_decay(get(archive, "lars_weight_decay").toDouble());
  epsilon(get(archive, "epsilon").toDouble());
}

void LarsParamState::serialize(::torch::serialize::OutputArchive& archive) const {
  put(archive, "velocity", velocity());
}

void LarsParamState::serialize(::torch::serialize::InputArchive& archive) { velocity(get_tensor(archive, "velocity")); }

// ---- what LAMB and LARS share ----

LayerwiseOptimizer::LayerwiseOptimizer(std::vector<OptimizerParamGroup> groups,
                                       std::unique_ptr<::torch::optim::OptimizerOptions> defaults,
                                       const std::vector<Tensor>& exclude_from_weight_decay)
    : Optimizer(std::move(groups), std::move(defaults)) {
  for (const auto& p : exclude_from_weight_decay) this->exclude_from_weight_decay(p);
}

void LayerwiseOptimizer::exclude_from_weight_decay(const Tensor& param) {
  excluded_.insert(param.unsafeGetTensorImpl());
}

bool LayerwiseOptimizer::excluded_from_weight_decay(const Tensor& param) const {
  return excluded_.count(param.unsafeGetTensorImpl()) > 0;
}

Tensor LayerwiseOptimizer::run_closure(const LossClosure& closure) {
  if (!closure) return {};
  ::torch::AutoGradMode enable_grad(true);
  return closure();
}

std::vector<std::pair<double, double>> LayerwiseOptimizer::pair_norms(const std::vector<NormPair>& pairs,
                                                                      size_t count) const {
  std::vector<Tensor> inputs;
  inputs.reserve(2 * pairs.size());
  for (const auto& p : pairs) {
    inputs.push_back(p.a);
    inputs.push_back(p.b);
  }
  auto local = squared_sums(inputs);
  std::vector<double> sums(2 * count, 0.0);
  for (size_t i = 0; i < pairs.size(); ++i) {
    sums[2 * pairs[i].index] = local[2 * i];
    sums[2 * pairs[i].index + 1] = local[2 * i + 1];
  }
  if (reducer_ && !sums.empty()) reducer_(sums);
  std::vector<std::pair<double, double>> norms;
  norms.reserve(pairs.size());
  for (const auto& p : pairs) norms.emplace_back(std::sqrt(sums[2 * p.index]), std::sqrt(sums[2 * p.index + 1]));
  return norms;
}

// ---- Lamb ----

Lamb::Lamb(std::vector<OptimizerParamGroup> param_groups, LambOptions defaults,
           const std::vector<Tensor>& exclude_from_weight_decay)
    : LayerwiseOptimizer(std::move(param_groups), std::make_unique<LambOptions>(defaults), exclude_from_weight_decay) {
  TORCH_CHECK(defaults.lr() >= 0, "Lamb: invalid learning rate ", defaults.lr());
  TORCH_CHECK(defaults.epsilon() >= 0, "Lamb: invalid epsilon ", defaults.epsilon());
  TORCH_CHECK(defaults.beta1() >= 0 && defaults.beta1() < 1, "Lamb: invalid beta1 ", defaults.beta1());
  TORCH_CHECK(defaults.beta2() >= 0 && defaults.beta2() < 1, "Lamb: invalid beta2 ", defaults.beta2());
  TORCH_CHECK(defaults.lamb_weight_decay() >= 0, "Lamb: invalid lamb_weight_decay ", defaults.lamb_weight_decay());
}

Lamb::Lamb(std::vector<Tensor> params, LambOptions defaults, const std::vector<Tensor>& exclude_from_weight_decay)
    : Lamb(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))}, defaults,
           exclude_from_weight_decay) {}

Tensor Lamb::step(LossClosure closure) {
  Tensor loss = run_closure(closure);
  ::torch::NoGradGuard no_grad;
  std::vector<double> lrs;
  std::vector<NormPair> pairs;  // w, r
  size_t count = 0;
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const LambOptions&>(group.options());
    for (auto& p : group.params()) {
      const size_t index = count++;
      if (!p.grad().defined()) continue;
      const auto& g = p.grad();
      check_grad(g);
      auto key = optimizer_state_key(p);
      auto it = state_.find(key);
      if (it == state_.end()) {
        auto st = std::make_unique<LambParamState>();
        st->moment1(::torch::zeros_like(p, ::torch::MemoryFormat::Preserve));
        st->moment2(::torch::zeros_like(p, ::torch::MemoryFormat::Preserve));
        it = state_.emplace(key, std::move(st)).first;
      }
      auto& st = static_cast<LambParamState&>(*it->second);
      st.step(st.step() + 1);
      const double b1 = o.beta1(), b2 = o.beta2();
      st.moment1().mul_(b1).add_(g, 1 - b1);
      st.moment2().mul_(b2).addcmul_(g, g, 1 - b2);
      const double bc1 = 1 - std::pow(b1, static_cast<double>(st.step()));
      const double bc2 = 1 - std::pow(b2, static_cast<double>(st.step()));
      auto r = (st.moment1() / bc1).div_((st.moment2() / bc2).sqrt_().add_(o.epsilon()));
      const double wd = excluded_from_weight_decay(p) ? 0.0 : o.lamb_weight_decay();
      if (wd != 0) r.add_(p, wd);
      pairs.push_back({index, p, r});
      lrs.push_back(o.lr());
    }
  }
  auto norms = pair_norms(pairs, count);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto [wn, rn] = norms[i];
    const double trust = (wn > 0 && rn > 0) ? wn / rn : 1.0;
    pairs[i].a.add_(pairs[i].b, -lrs[i] * trust);
  }
  return loss;
}

void Lamb::save(::torch::serialize::OutputArchive& archive) const {
  ::torch::optim::serialize<LambParamState, LambOptions>(archive, *this);
}

void Lamb::load(::torch::serialize::InputArchive& archive) {
  load_state_and_options<LambParamState, LambOptions>(archive);
}

// ---- Lars ----

Lars::Lars(std::vector<OptimizerParamGroup> param_groups, LarsOptions defaults,
           const std::vector<Tensor>& exclude_from_weight_decay)
    : LayerwiseOptimizer(std::move(param_groups), std::make_unique<LarsOptions>(defaults), exclude_from_weight_decay) {
  TORCH_CHECK(defaults.lr() >= 0, "Lars: invalid learning rate ", defaults.lr());
  TORCH_CHECK(defaults.momentum() >= 0, "Lars: invalid momentum ", defaults.momentum());
  TORCH_CHECK(defaults.lars_coeff() >= 0, "Lars: invalid lars_coeff ", defaults.lars_coeff());
  TORCH_CHECK(defaults.lars_weight_decay() >= 0, "Lars: invalid lars_weight_decay ", defaults.lars_weight_decay());
  TORCH_CHECK(defaults.epsilon() >= 0, "Lars: invalid epsilon ", defaults.epsilon());
}

Lars::Lars(std::vector<Tensor> params, LarsOptions defaults, const std::vector<Tensor>& exclude_from_weight_decay)
    : Lars(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))}, defaults,
           exclude_from_weight_decay) {}

Tensor Lars::step(LossClosure closure) {
  Tensor loss = run_closure(closure);
  ::torch::NoGradGuard no_grad;
  std::vector<std::pair<const LarsOptions*, double>> options;  // and wd
  std::vector<NormPair> pairs;                                 // w, g
  size_t count = 0;
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const LarsOptions&>(group.options());
    for (auto& p : group.params()) {
      const size_t index = count++;
      if (!p.grad().defined()) continue;
      check_grad(p.grad());
      options.emplace_back(&o, excluded_from_weight_decay(p) ? 0.0 : o.lars_weight_decay());
      pairs.push_back({index, p, p.grad()});
    }
  }
  auto norms = pair_norms(pairs, count);
  for (size_t i = 0; i < pairs.size(); ++i) {
    auto& p = pairs[i].a;
    const auto& [o, wd] = options[i];
    const auto [pn, gn] = norms[i];
    double local_lr = o->lr();
    if (wd > 0 && pn > 0 && gn > 0) local_lr = o->lr() * o->lars_coeff() * pn / (gn + wd * pn + o->epsilon());
    auto key = optimizer_state_key(p);
    auto it = state_.find(key);
    if (it == state_.end()) {
      auto st = std::make_unique<LarsParamState>();
      st->velocity(::torch::zeros_like(p, ::torch::MemoryFormat::Preserve));
      it = state_.emplace(key, std::move(st)).first;
    }
    auto& v = static_cast<LarsParamState&>(*it->second).velocity();
    v.mul_(o->momentum());
    if (wd != 0)
      v.add_(p.grad() + wd * p, local_lr);
    else
      v.add_(p.grad(), local_lr);
    p.sub_(v);
  }
  return loss;
}

void Lars::save(::torch::serialize::OutputArchive& archive) const {
  ::torch::optim::serialize<LarsParamState, LarsOptions>(archive, *this);
}

void Lars::load(::torch::serialize::InputArchive& archive) {
  load_state_and_options<LarsParamState, LarsOptions>(archive);
}

// ---- strategy ----

namespace {

std::string type_name(const ::torch::optim::Optimizer& o) {
  if (dynamic_cast<const ::torch::optim::SGD*>(&o)) return "torch::optim::SGD";
  if (dynamic_cast<const ::torch::optim::Adam*>(&o)) return "torch::optim::Adam";
  if (dynamic_cast<const ::torch::optim::AdamW*>(&o)) return "torch::optim::AdamW";
  if (dynamic_cast<const ::torch::optim::Adagrad*>(&o)) return "torch::optim::Adagrad";
  if (dynamic_cast<const ::torch::optim::RMSprop*>(&o)) return "torch::optim::RMSprop";
  if (dynamic_cast<const ::torch::optim::LBFGS*>(&o)) return "torch::optim::LBFGS";
  if (dynamic_cast<const Lamb*>(&o)) return "dtrain::fleet::Lamb";
  if (dynamic_cast<const Lars*>(&o)) return "dtrain::fleet::Lars";
  return typeid(o).name();
}

std::vector<Tensor> excluded_params(const std::vector<OptimizerParamGroup>& groups,
                                    const std::vector<std::string>& patterns,
                                    const std::function<std::string(const Tensor&)>& name_of) {
  std::vector<Tensor> out;
  if (patterns.empty()) return out;
  if (!name_of)
    throw InvalidUsage("apply_optimizer_strategy: exclude_from_weight_decay needs parameter names (name_of is empty)");
  for (const auto& g : groups)
    for (const auto& p : g.params()) {
      auto name = name_of(p);
      for (const auto& pat : patterns)
        if (!pat.empty() && name.find(pat) != std::string::npos) {
          out.push_back(p);
          break;
        }
    }
  return out;
}

}  // namespace

std::shared_ptr<::torch::optim::Optimizer> apply_optimizer_strategy(
    std::shared_ptr<::torch::optim::Optimizer> inner, const StrategyOptions& s,
    const std::function<std::string(const Tensor&)>& name_of) {
  if (!inner) throw InvalidUsage("apply_optimizer_strategy: the optimizer is null");
  if (s.lamb && s.lars) throw InvalidUsage("strategy.lamb and strategy.lars cannot both be on; choose one");
  if (s.lamb) {
    if (!dynamic_cast<::torch::optim::Adam*>(inner.get()))
      throw InvalidUsage("strategy.lamb replaces an Adam optimizer; got " + type_name(*inner) +
                         " (construct a torch::optim::Adam, or turn strategy.lamb off)");
    std::vector<OptimizerParamGroup> groups;
    for (const auto& g : inner->param_groups()) {
      const auto& a = static_cast<const ::torch::optim::AdamOptions&>(g.options());
      LambOptions o(a.lr());
      o.beta1(std::get<0>(a.betas())).beta2(std::get<1>(a.betas())).epsilon(a.eps());
      o.lamb_weight_decay(s.lamb_weight_decay);
      groups.emplace_back(g.params(), std::make_unique<LambOptions>(o));
    }
    auto excluded = excluded_params(inner->param_groups(), s.lamb_exclude_from_weight_decay, name_of);
    const auto& d = static_cast<const ::torch::optim::AdamOptions&>(inner->defaults());
    LambOptions defaults(d.lr());
    defaults.beta1(std::get<0>(d.betas())).beta2(std::get<1>(d.betas())).epsilon(d.eps());
    defaults.lamb_weight_decay(s.lamb_weight_decay);
    return std::make_shared<Lamb>(std::move(groups), defaults, excluded);
  }
  if (s.lars) {
    auto* sgd = dynamic_cast<::torch::optim::SGD*>(inner.get());
    if (!sgd)
      throw InvalidUsage("strategy.lars replaces a Momentum optimizer (torch::optim::SGD with momentum > 0); got " +
                         type_name(*inner));
    std::vector<OptimizerParamGroup> groups;
    for (const auto& g : inner->param_groups()) {
      const auto& m = static_cast<const ::torch::optim::SGDOptions&>(g.options());
      if (!(m.momentum() > 0))
        throw InvalidUsage(
            "strategy.lars replaces a Momentum optimizer; got torch::optim::SGD with momentum 0 "
            "(set SGDOptions::momentum > 0)");
      LarsOptions o(m.lr());
      o.momentum(m.momentum()).lars_coeff(s.lars_coeff).lars_weight_decay(s.lars_weight_decay).epsilon(s.lars_epsilon);
      groups.emplace_back(g.params(), std::make_unique<LarsOptions>(o));
    }
    auto excluded = excluded_params(inner->param_groups(), s.lars_exclude_from_weight_decay, name_of);
    const auto& d = static_cast<const ::torch::optim::SGDOptions&>(inner->defaults());
    LarsOptions defaults(d.lr());
    defaults.momentum(d.momentum() > 0 ? d.momentum() : 0.9)
        .lars_coeff(s.lars_coeff)
        .lars_weight_decay(s.lars_weight_decay)
        .epsilon(s.lars_epsilon);
    return std::make_shared<Lars>(std::move(groups), defaults, excluded);
  }
  return inner;
}

// ---- clipping ----

double clip_grad_global_norm(const std::vector<Tensor>& params, double max_norm, const NormReducer& reduce) {
  if (!(max_norm > 0))
    throw InvalidUsage("clip_grad_global_norm: max_norm must be > 0, got " + std::to_string(max_norm));
  ::torch::NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) {
      check_grad(p.grad());
      grads.push_back(p.grad());
    }
  double local = 0;
  for (double v : squared_sums(grads)) local += v;
  std::vector<double> sum{local};
  if (reduce) reduce(sum);
  const double total = std::sqrt(sum[0]);
  if (std::isfinite(total) && total > max_norm) {
    const double scale = max_norm / total;
    for (auto& g : grads) g.mul_(scale);
  }
  return total;
}

}  // namespace dtrain::fleet
