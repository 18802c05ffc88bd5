// LAMB, LARS and clipping by global norm (dtrain/fleet/optimizers.h) against
// Paddle's formulas written out here element by element in double precision,
// sharded (two zero-padded slices on two ranks as threads over gloo, norms
// summed by the norm reducer) against one process, state save/load, and the
// strategy's optimizer replacement.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtrain/buffer.h"
#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/strategy.h"
#include "dtrain/fleet/optimizers.h"
#include "rank_threads.h"

// One unity source with its program's other files (dtrain_torch_gtests).
namespace optimizers_test {

using dtrain::fleet::Lamb;
using dtrain::fleet::LambOptions;
using dtrain::fleet::LambParamState;
using dtrain::fleet::Lars;
using dtrain::fleet::LarsOptions;
using dtrain::fleet::LarsParamState;
using Vec = std::vector<double>;

namespace {

constexpr int kWorld = 2;

::torch::Tensor to_tensor(const Vec& v, ::torch::Dtype dtype = ::torch::kFloat64) {
  return ::torch::tensor(v, ::torch::kFloat64).to(dtype);
}

Vec to_vec(const ::torch::Tensor& t) {
  auto c = t.detach().to(::torch::kFloat64).contiguous().reshape({-1});
  return Vec(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

double norm(const Vec& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// The gradient of parameter k at `step` for element i (of the whole
// parameter), a function of the weight too.
double grad_at(int k, int step, size_t i, double w) { return std::sin(0.7 * i + 1.3 * step + k) * (k + 1) + 0.1 * w; }

void expect_near(const Vec& got, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << what << " element " << i;
}

// One parameter of the reference: weights, gradient rule, optimizer state.
struct Ref {
  Vec w, m, v;
  bool zero_grad = false;  // its gradient is all zeros
  bool excluded = false;
  double lr = 0;
};

Vec ref_grad(const Ref& p, int k, int step) {
  Vec g(p.w.size(), 0.0);
  if (!p.zero_grad)
    for (size_t i = 0; i < g.size(); ++i) g[i] = grad_at(k, step, i, p.w[i]);
  return g;
}

void set_grads(const std::vector<::torch::Tensor>& params, const std::vector<Ref>& ref, int step) {
  for (size_t k = 0; k < params.size(); ++k)
    params[k].mutable_grad() = to_tensor(ref_grad(ref[k], static_cast<int>(k), step), params[k].scalar_type());
}

// Paddle's LAMB for one parameter at step t (from 1).
void lamb_ref(Ref& p, const Vec& g, int t, double b1, double b2, double eps, double wd) {
  const size_t n = p.w.size();
  if (p.m.empty()) p.m.assign(n, 0.0), p.v.assign(n, 0.0);
  Vec r(n);
  for (size_t i = 0; i < n; ++i) {
    p.m[i] = b1 * p.m[i] + (1 - b1) * g[i];
    p.v[i] = b2 * p.v[i] + (1 - b2) * g[i] * g[i];
    double mh = p.m[i] / (1 - std::pow(b1, t)), vh = p.v[i] / (1 - std::pow(b2, t));
    r[i] = mh / (std::sqrt(vh) + eps) + (p.excluded ? 0.0 : wd) * p.w[i];
  }
  double wn = norm(p.w), rn = norm(r);
  double trust = wn > 0 && rn > 0 ? wn / rn : 1.0;
  for (size_t i = 0; i < n; ++i) p.w[i] -= p.lr * trust * r[i];
}

// Paddle's lars_momentum for one parameter (p.m is the velocity).
void lars_ref(Ref& p, const Vec& g, double mu, double coeff, double wd0, double eps) {
  const size_t n = p.w.size();
  if (p.m.empty()) p.m.assign(n, 0.0);
  double wd = p.excluded ? 0.0 : wd0;
  double wn = norm(p.w), gn = norm(g);
  double local_lr = p.lr;
  if (wd > 0 && wn > 0 && gn > 0) local_lr = p.lr * coeff * wn / (gn + wd * wn + eps);
  for (size_t i = 0; i < n; ++i) {
    p.m[i] = mu * p.m[i] + local_lr * (g[i] + wd * p.w[i]);
    p.w[i] -= p.m[i];
  }
}

// Four parameters in two groups: A plain, B excluded from weight decay, C all
// zeros (||w|| = 0), D zero gradient and excluded (||r|| = ||g|| = 0).
std::vector<Ref> make_refs() {
  std::vector<Ref> r(4);
  r[0].w = {0.5, -1.25, 0.75, 2.0, -0.3, 0.1};
  r[1].w = {1.5, -0.5, 0.25, 0.8};
  r[1].excluded = true;
  r[2].w = {0.0, 0.0, 0.0};
  r[3].w = {0.2, -0.4};
  r[3].zero_grad = true;
  r[3].excluded = true;
  r[0].lr = r[1].lr = 0.05;
  r[2].lr = r[3].lr = 0.02;
  return r;
}

std::vector<::torch::Tensor> make_params(const std::vector<Ref>& refs) {
  std::vector<::torch::Tensor> ps;
  for (const auto& r : refs) ps.push_back(to_tensor(r.w).requires_grad_(true));
  return ps;
}

template <typename Options>
std::vector<::torch::optim::OptimizerParamGroup> two_groups(const std::vector<::torch::Tensor>& ps, double lr0,
                                                            double lr1, const Options& base) {
  std::vector<::torch::optim::OptimizerParamGroup> groups;
  auto o0 = base, o1 = base;
  o0.lr(lr0);
  o1.lr(lr1);
  groups.emplace_back(std::vector<::torch::Tensor>{ps[0], ps[1]}, std::make_unique<Options>(o0));
  groups.emplace_back(std::vector<::torch::Tensor>{ps[2], ps[3]}, std::make_unique<Options>(o1));
  return groups;
}

}  // namespace

TEST(lamb, MatchesPaddleFormula) {
  auto refs = make_refs();
  auto ps = make_params(refs);
  LambOptions base;
  base.beta1(0.8).beta2(0.95).epsilon(1e-6).lamb_weight_decay(0.1);
  Lamb opt(two_groups(ps, 0.05, 0.02, base), base, {ps[1], ps[3]});
  EXPECT_TRUE(opt.excluded_from_weight_decay(ps[1]));
  EXPECT_FALSE(opt.excluded_from_weight_decay(ps[0]));
  for (int step = 1; step <= 6; ++step) {
    if (step == 4) {  // the trainer's lr schedule
      opt.param_groups()[0].options().set_lr(0.01);
      refs[0].lr = refs[1].lr = 0.01;
    }
    set_grads(ps, refs, step);
    for (size_t k = 0; k < refs.size(); ++k)
      lamb_ref(refs[k], ref_grad(refs[k], static_cast<int>(k), step), step, 0.8, 0.95, 1e-6, 0.1);
    opt.step();
    for (size_t k = 0; k < refs.size(); ++k)
      expect_near(to_vec(ps[k]), refs[k].w, 1e-12, "step " + std::to_string(step) + " param " + std::to_string(k));
  }
  // C (zero weights) moved with trust 1; D (zero gradient, no decay) did not.
  EXPECT_GT(norm(to_vec(ps[2])), 0.0);
  expect_near(to_vec(ps[3]), {0.2, -0.4}, 0, "zero-gradient parameter");
}

TEST(lars, MatchesPaddleFormula) {
  auto refs = make_refs();
  auto ps = make_params(refs);
  LarsOptions base;
  base.momentum(0.9).lars_coeff(0.02).lars_weight_decay(0.05).epsilon(1e-3);
  Lars opt(two_groups(ps, 0.05, 0.02, base), base, {ps[1], ps[3]});
  for (int step = 1; step <= 6; ++step) {
    if (step == 4) {
      opt.param_groups()[1].options().set_lr(0.5);
      refs[2].lr = refs[3].lr = 0.5;
    }
    set_grads(ps, refs, step);
    for (size_t k = 0; k < refs.size(); ++k)
      lars_ref(refs[k], ref_grad(refs[k], static_cast<int>(k), step), 0.9, 0.02, 0.05, 1e-3);
    opt.step();
    for (size_t k = 0; k < refs.size(); ++k)
      expect_near(to_vec(ps[k]), refs[k].w, 1e-12, "step " + std::to_string(step) + " param " + std::to_string(k));
  }
  expect_near(to_vec(ps[3]), {0.2, -0.4}, 0, "zero-gradient excluded parameter");
}

TEST(lars, WithoutDecayIsPlainMomentum) {
  // lars_weight_decay = 0: Paddle's kernel falls back to lr (no LARS scaling).
  auto w = to_tensor({1.0, -2.0, 3.0}).requires_grad_(true);
  Lars opt(std::vector<::torch::Tensor>{w}, LarsOptions(0.1).momentum(0.5).lars_weight_decay(0));
  Vec ww = {1.0, -2.0, 3.0}, v(3, 0.0);
  for (int step = 0; step < 3; ++step) {
    Vec g = {0.5 + step, -1.0, 0.25 * step};
    w.mutable_grad() = to_tensor(g);
    opt.step();
    for (int i = 0; i < 3; ++i) v[i] = 0.5 * v[i] + 0.1 * g[i], ww[i] -= v[i];
    expect_near(to_vec(w), ww, 1e-14, "step " + std::to_string(step));
  }
}

namespace {

// A float parameter of `n` elements sharded over kWorld ranks: each slice has
// ceil(n / kWorld) elements, the last one zero-padded.
struct Sharded {
  Vec full;
  int64_t n() const { return static_cast<int64_t>(full.size()); }
  int64_t slice() const { return (n() + kWorld - 1) / kWorld; }
  Vec slice_of(const Vec& v, int rank) const {
    Vec s(slice(), 0.0);
    for (int64_t i = 0; i < slice(); ++i)
      if (rank * slice() + i < n()) s[i] = v[rank * slice() + i];
    return s;
  }
};

// Gradients of the sharded weights: element i of the whole parameter gets
// grad_at(k, step, i, w); padding gets 0.
void set_sharded_grads(const std::vector<::torch::Tensor>& ps, const std::vector<Sharded>& shapes, int rank, int step) {
  for (size_t k = 0; k < ps.size(); ++k) {
    Vec w = to_vec(ps[k]), g(w.size(), 0.0);
    int64_t base = rank < 0 ? 0 : rank * shapes[k].slice();
    for (size_t i = 0; i < w.size(); ++i)
      if (base + static_cast<int64_t>(i) < shapes[k].n()) g[i] = grad_at(static_cast<int>(k), step, base + i, w[i]);
    ps[k].mutable_grad() = to_tensor(g, ::torch::kFloat32);
  }
}

using MakeOpt = std::function<std::shared_ptr<::torch::optim::Optimizer>(const std::vector<::torch::Tensor>&)>;

void set_reducer(::torch::optim::Optimizer& opt, dtrain::fleet::NormReducer r) {
  if (auto* l = dynamic_cast<Lamb*>(&opt)) return l->set_norm_reducer(std::move(r));
  dynamic_cast<Lars&>(opt).set_norm_reducer(std::move(r));
}

// N steps over two ranks holding zero-padded slices, against one process
// holding the whole parameters. Float32 parameters: the only differences are
// the order in which the double squared sums add up (slices, then across
// ranks), i.e. ~1e-16 relative in the trust ratios, below one float ulp of
// the updates; 1e-6 absolute is a float ulp at these magnitudes.
void expect_sharded_equals_whole(const MakeOpt& make) {
  std::vector<Sharded> shapes(2);
  shapes[0].full = {0.5, -1.25, 0.75, 2.0, -0.3, 0.1, 0.9};  // 7 = 4 + 3 and one pad
  shapes[1].full = {1.5, -0.5, 0.25, 0.8, -0.6};             // 5 = 3 + 2 and one pad
  constexpr int kSteps = 5;
  std::vector<::torch::Tensor> whole;
  for (auto& s : shapes) whole.push_back(to_tensor(s.full, ::torch::kFloat32).requires_grad_(true));
  auto single = make(whole);
  for (int step = 1; step <= kSteps; ++step) {
    set_sharded_grads(whole, shapes, -1, step);
    single->step();
  }
  std::vector<std::vector<Vec>> got(kWorld), unreduced(kWorld);
  dtrain::test::run_rank_threads(
      "gloo", kWorld, std::chrono::seconds(60), [&](int rank, const std::shared_ptr<dtrain::Communicator>& comm) {
        std::vector<::torch::Tensor> ps;
        for (auto& s : shapes)
          ps.push_back(to_tensor(s.slice_of(s.full, rank), ::torch::kFloat32).requires_grad_(true));
        auto opt = make(ps);
        set_reducer(*opt, [comm](std::vector<double>& v) {
          comm->allreduce(dtrain::Buffer::of(v.data(), v.size()), dtrain::ReduceOp::Sum,
                          dtrain::CallOptions::wait_now());
        });
        // The control: the same slices with local norms only.
        std::vector<::torch::Tensor> local_ps;
        for (auto& p : ps) local_ps.push_back(p.detach().clone().requires_grad_(true));
        auto local_opt = make(local_ps);
        for (int step = 1; step <= kSteps; ++step) {
          set_sharded_grads(ps, shapes, rank, step);
          set_sharded_grads(local_ps, shapes, rank, step);
          opt->step();
          local_opt->step();
        }
        for (auto& p : ps) got[rank].push_back(to_vec(p));
        for (auto& p : local_ps) unreduced[rank].push_back(to_vec(p));
      });
  for (size_t k = 0; k < shapes.size(); ++k) {
    Vec w = to_vec(whole[k]);
    EXPECT_GT(std::abs(w[0] - shapes[k].full[0]), 1e-4) << "parameter " << k << " did not move";
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_EQ(got[r].size(), shapes.size());
      expect_near(got[r][k], shapes[k].slice_of(w, r), 1e-6,
                  "parameter " + std::to_string(k) + " rank " + std::to_string(r));
    }
  }
  double control = 0;
  for (size_t k = 0; k < shapes.size(); ++k)
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_EQ(unreduced[r].size(), shapes.size());
      auto want = shapes[k].slice_of(to_vec(whole[k]), r);
      for (size_t i = 0; i < want.size(); ++i) control = std::max(control, std::abs(unreduced[r][k][i] - want[i]));
    }
  EXPECT_GT(control, 1e-4) << "local norms give the same result: the test cannot see the reduction";
  EXPECT_EQ(got[1][0].back(), 0.0) << "padding moved";
  EXPECT_EQ(got[1][1].back(), 0.0) << "padding moved";
}

}  // namespace

TEST(lamb, ShardedNormReducerEqualsWhole) {
  expect_sharded_equals_whole([](const std::vector<::torch::Tensor>& ps) {
    return std::make_shared<Lamb>(ps, LambOptions(0.05).lamb_weight_decay(0.1), std::vector<::torch::Tensor>{ps[1]});
  });
}

TEST(lars, ShardedNormReducerEqualsWhole) {
  expect_sharded_equals_whole([](const std::vector<::torch::Tensor>& ps) {
    return std::make_shared<Lars>(ps, LarsOptions(0.5).lars_coeff(0.02).lars_weight_decay(0.05).epsilon(1e-4),
                                  std::vector<::torch::Tensor>{ps[1]});
  });
}

namespace {

template <typename Opt, typename Options, typename State>
void expect_save_load_round_trips(const Options& options) {
  auto refs = make_refs();
  auto a = make_params(refs);
  Opt first(a, options, {a[1]});
  for (int step = 1; step <= 2; ++step) {
    set_grads(a, refs, step);
    first.step();
  }
  first.param_groups()[0].options().set_lr(options.lr() * 0.5);
  std::stringstream saved;
  ::torch::save(first, saved);

  std::vector<::torch::Tensor> b;
  for (auto& p : a) b.push_back(p.detach().clone().requires_grad_(true));
  Opt second(b, options, {b[1]});
  ::torch::load(second, saved);
  EXPECT_DOUBLE_EQ(second.param_groups()[0].options().get_lr(), options.lr() * 0.5);
  ASSERT_EQ(second.state().size(), first.state().size());
  for (size_t k = 0; k < a.size(); ++k) {
    auto& sa = static_cast<State&>(*first.state().at(dtrain::fleet::optimizer_state_key(a[k])));
    auto& sb = static_cast<State&>(*second.state().at(dtrain::fleet::optimizer_state_key(b[k])));
    if constexpr (std::is_same<State, LambParamState>::value) {
      EXPECT_EQ(sb.step(), 2);
      EXPECT_TRUE(sb.moment1().equal(sa.moment1()));
      EXPECT_TRUE(sb.moment2().equal(sa.moment2()));
    } else {
      EXPECT_TRUE(sb.velocity().equal(sa.velocity()));
    }
  }
  for (int step = 3; step <= 4; ++step) {
    set_grads(a, refs, step);
    set_grads(b, refs, step);
    first.step();
    second.step();
  }
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(a[k].equal(b[k])) << "parameter " << k;
}

}  // namespace

TEST(lamb, SaveLoadRoundTrips) { expect_save_load_round_trips<Lamb, LambOptions, LambParamState>(LambOptions(0.05)); }

TEST(lars, SaveLoadRoundTrips) {
  expect_save_load_round_trips<Lars, LarsOptions, LarsParamState>(LarsOptions(0.05).lars_coeff(0.02));
}

namespace {

struct Net {
  ::torch::nn::Linear fc{4, 3};
  std::vector<::torch::Tensor> params() const { return {fc->weight, fc->bias}; }
  std::function<std::string(const ::torch::Tensor&)> name_of() const {
    auto w = fc->weight.unsafeGetTensorImpl(), b = fc->bias.unsafeGetTensorImpl();
    return [w, b](const ::torch::Tensor& t) -> std::string {
      return t.unsafeGetTensorImpl() == w ? "fc.weight" : t.unsafeGetTensorImpl() == b ? "fc.bias" : "?";
    };
  }
};

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dtrain::InvalidUsage& e) {
    return e.what();
  }
  return "(no InvalidUsage)";
}

}  // namespace

TEST(lamb_lars, ApplyStrategyRefusesLambOverSgd) {
  Net net;
  dtrain::StrategyOptions s;
  s.lamb = true;
  auto sgd = std::make_shared<::torch::optim::SGD>(net.params(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
  auto msg = message_of([&] { dtrain::fleet::apply_optimizer_strategy(sgd, s, net.name_of()); });
  EXPECT_NE(msg.find("strategy.lamb replaces an Adam optimizer; got torch::optim::SGD"), std::string::npos) << msg;

  s.lamb = false;
  s.lars = true;
  auto adam = std::make_shared<::torch::optim::Adam>(net.params());
  msg = message_of([&] { dtrain::fleet::apply_optimizer_strategy(adam, s, net.name_of()); });
  EXPECT_NE(msg.find("strategy.lars replaces a Momentum optimizer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got torch::optim::Adam"), std::string::npos) << msg;
  auto plain = std::make_shared<::torch::optim::SGD>(net.params(), ::torch::optim::SGDOptions(0.1));
  msg = message_of([&] { dtrain::fleet::apply_optimizer_strategy(plain, s, net.name_of()); });
  EXPECT_NE(msg.find("momentum 0"), std::string::npos) << msg;
}

TEST(lamb_lars, ApplyStrategyMakesLambAndLars) {
  Net net;
  dtrain::StrategyOptions s;
  auto adam = std::make_shared<::torch::optim::Adam>(
      net.params(), ::torch::optim::AdamOptions(0.003).betas(std::make_tuple(0.8, 0.99)).eps(1e-7));
  EXPECT_EQ(dtrain::fleet::apply_optimizer_strategy(adam, s, net.name_of()).get(),
            static_cast<::torch::optim::Optimizer*>(adam.get()));

  s.lamb = true;
  s.lamb_weight_decay = 0.02;
  s.lamb_exclude_from_weight_decay = {"bias"};
  auto opt = dtrain::fleet::apply_optimizer_strategy(adam, s, net.name_of());
  auto* lamb = dynamic_cast<Lamb*>(opt.get());
  ASSERT_NE(lamb, nullptr);
  ASSERT_EQ(lamb->param_groups().size(), 1u);
  const auto& o = static_cast<const LambOptions&>(lamb->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(o.lr(), 0.003);
  EXPECT_DOUBLE_EQ(o.beta1(), 0.8);
  EXPECT_DOUBLE_EQ(o.beta2(), 0.99);
  EXPECT_DOUBLE_EQ(o.epsilon(), 1e-7);
  EXPECT_DOUBLE_EQ(o.lamb_weight_decay(), 0.02);
  EXPECT_TRUE(lamb->excluded_from_weight_decay(net.fc->bias));
  EXPECT_FALSE(lamb->excluded_from_weight_decay(net.fc->weight));
  lamb->param_groups()[0].options().set_lr(0.5);
  EXPECT_DOUBLE_EQ(o.lr(), 0.5);

  s.lamb = false;
  s.lars = true;
  s.lars_coeff = 0.002;
  s.lars_weight_decay = 0.001;
  s.lars_epsilon = 1e-9;
  s.lars_exclude_from_weight_decay = {"weight"};
  auto sgd = std::make_shared<::torch::optim::SGD>(net.params(), ::torch::optim::SGDOptions(0.1).momentum(0.7));
  opt = dtrain::fleet::apply_optimizer_strategy(sgd, s, net.name_of());
  auto* lars = dynamic_cast<Lars*>(opt.get());
  ASSERT_NE(lars, nullptr);
  const auto& lo = static_cast<const LarsOptions&>(lars->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(lo.lr(), 0.1);
  EXPECT_DOUBLE_EQ(lo.momentum(), 0.7);
  EXPECT_DOUBLE_EQ(lo.lars_coeff(), 0.002);
  EXPECT_DOUBLE_EQ(lo.lars_weight_decay(), 0.001);
  EXPECT_DOUBLE_EQ(lo.epsilon(), 1e-9);
  EXPECT_TRUE(lars->excluded_from_weight_decay(net.fc->weight));
  EXPECT_FALSE(lars->excluded_from_weight_decay(net.fc->bias));
}

TEST(clip, GlobalNormMatchesFormula) {
  Vec g0 = {3.0, -4.0, 1.0}, g1 = {2.0, 0.5};
  auto a = to_tensor({1, 1, 1}).requires_grad_(true), b = to_tensor({1, 1}).requires_grad_(true),
       c = to_tensor({1.0}).requires_grad_(true);  // no gradient: skipped
  const double total = std::sqrt(9 + 16 + 1 + 4 + 0.25);
  a.mutable_grad() = to_tensor(g0);
  b.mutable_grad() = to_tensor(g1);
  // Below the limit: untouched.
  EXPECT_DOUBLE_EQ(dtrain::fleet::clip_grad_global_norm({a, b, c}, 10.0), total);
  expect_near(to_vec(a.grad()), g0, 0, "unclipped");
  // Above: every gradient times max_norm / max(global_norm, max_norm).
  const double max_norm = 2.0;
  EXPECT_DOUBLE_EQ(dtrain::fleet::clip_grad_global_norm({a, b, c}, max_norm), total);
  Vec w0 = g0, w1 = g1;
  for (auto& x : w0) x *= max_norm / total;
  for (auto& x : w1) x *= max_norm / total;
  expect_near(to_vec(a.grad()), w0, 1e-15, "clipped a");
  expect_near(to_vec(b.grad()), w1, 1e-15, "clipped b");
  EXPECT_NEAR(std::sqrt(std::pow(norm(to_vec(a.grad())), 2) + std::pow(norm(to_vec(b.grad())), 2)), max_norm, 1e-12);
  EXPECT_FALSE(c.grad().defined());
}

namespace {

// Gradients of two parameters (sizes 9 and 4), large enough to be clipped.
std::vector<Vec> clip_grads(int rank = 0) {
  std::vector<Vec> g = {Vec(9), Vec(4)};
  for (size_t k = 0; k < g.size(); ++k)
    for (size_t i = 0; i < g[k].size(); ++i) g[k][i] = std::sin(0.9 * i + k + 0.4 * rank) * (3 + rank);
  return g;
}

std::vector<Vec> clip_in_one_process(const std::vector<Vec>& grads, double max_norm, double* total) {
  std::vector<::torch::Tensor> ps;
  for (auto& g : grads) {
    ps.push_back(::torch::zeros({static_cast<int64_t>(g.size())}, ::torch::kFloat32).requires_grad_(true));
    ps.back().mutable_grad() = to_tensor(g, ::torch::kFloat32);
  }
  *total = dtrain::fleet::clip_grad_global_norm(ps, max_norm);
  std::vector<Vec> out;
  for (auto& p : ps) out.push_back(to_vec(p.grad()));
  return out;
}

dtrain::fleet::NormReducer allreduce_sum(const std::shared_ptr<dtrain::Communicator>& comm) {
  return [comm](std::vector<double>& v) {
    comm->allreduce(dtrain::Buffer::of(v.data(), v.size()), dtrain::ReduceOp::Sum, dtrain::CallOptions::wait_now());
  };
}

}  // namespace

// Each rank holds half of each gradient (the second half zero-padded): the
// clipped halves equal the halves of the whole gradients clipped in one
// process. Float32 gradients; the norms differ only in summation order (in
// double), so the scale agrees to ~1e-16 and the results to a float ulp.
TEST(clip, ShardedEqualsWhole) {
  const double max_norm = 1.5;
  auto grads = clip_grads();
  double want_total = 0;
  auto want = clip_in_one_process(grads, max_norm, &want_total);
  std::vector<std::vector<Vec>> got(kWorld);
  std::vector<double> totals(kWorld);
  dtrain::test::run_rank_threads(
      "gloo", kWorld, std::chrono::seconds(60), [&](int rank, const std::shared_ptr<dtrain::Communicator>& comm) {
        std::vector<::torch::Tensor> ps;
        for (auto& g : grads) {
          Sharded s{g};
          ps.push_back(::torch::zeros({s.slice()}, ::torch::kFloat32).requires_grad_(true));
          ps.back().mutable_grad() = to_tensor(s.slice_of(g, rank), ::torch::kFloat32);
        }
        totals[rank] = dtrain::fleet::clip_grad_global_norm(ps, max_norm, allreduce_sum(comm));
        for (auto& p : ps) got[rank].push_back(to_vec(p.grad()));
      });
  EXPECT_GT(want_total, max_norm);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NEAR(totals[r], want_total, 1e-12 * want_total) << "rank " << r;
    ASSERT_EQ(got[r].size(), grads.size());
    for (size_t k = 0; k < grads.size(); ++k)
      expect_near(got[r][k], Sharded{want[k]}.slice_of(want[k], r), 1e-6,
                  "gradient " + std::to_string(k) + " rank " + std::to_string(r));
  }
}

// Data parallelism: each rank's own gradients, averaged by an all-reduce (as
// DataParallel does), then clipped with no reducer (every rank holds the
// whole average), equal the average clipped in one process.
TEST(clip, DataParallelEqualsOneProcess) {
  const double max_norm = 1.5;
  std::vector<Vec> avg = clip_grads(0);
  auto g1 = clip_grads(1);
  for (size_t k = 0; k < avg.size(); ++k)
    for (size_t i = 0; i < avg[k].size(); ++i) avg[k][i] = (avg[k][i] + g1[k][i]) / kWorld;
  double want_total = 0;
  auto want = clip_in_one_process(avg, max_norm, &want_total);
  std::vector<std::vector<Vec>> got(kWorld);
  std::vector<double> totals(kWorld);
  dtrain::test::run_rank_threads(
      "gloo", kWorld, std::chrono::seconds(60), [&](int rank, const std::shared_ptr<dtrain::Communicator>& comm) {
        std::vector<::torch::Tensor> ps;
        for (auto& g : clip_grads(rank)) {
          ps.push_back(::torch::zeros({static_cast<int64_t>(g.size())}, ::torch::kFloat32).requires_grad_(true));
          auto grad = to_tensor(g, ::torch::kFloat32);
          comm->allreduce(dtrain::Buffer::of(grad.data_ptr<float>(), grad.numel()), dtrain::ReduceOp::Sum,
                          dtrain::CallOptions::wait_now());
          ps.back().mutable_grad() = grad / kWorld;
        }
        totals[rank] = dtrain::fleet::clip_grad_global_norm(ps, max_norm);
        for (auto& p : ps) got[rank].push_back(to_vec(p.grad()));
      });
  EXPECT_GT(want_total, max_norm);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NEAR(totals[r], want_total, 1e-6 * want_total) << "rank " << r;
    for (size_t k = 0; k < avg.size(); ++k)
      expect_near(got[r][k], want[k], 1e-6, "gradient " + std::to_string(k) + " rank " + std::to_string(r));
  }
}

}  // namespace optimizers_test
