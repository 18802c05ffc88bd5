#include "dtrain/fleet/blocks.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "dtrain/error.h"

namespace dtrain::fleet {

namespace {

using ::torch::Tensor;
using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::vector<BlockObserver*>& registry() {
  static std::vector<BlockObserver*> r;
  return r;
}

std::vector<BlockObserver*> owners_of(const ::torch::nn::Module& block) {
  std::vector<BlockObserver*> out;
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (auto* o : registry())
    if (o->owns(block)) out.push_back(o);
  return out;
}

// What a checkpointed block's backward needs: the function, its block and the
// state it ran under (RNG, autocast).
struct CheckpointState : ::torch::CustomClassHolder {
  BlockFn fn;
  ::torch::nn::Module* block = nullptr;
  ::torch::Device device = ::torch::kCPU;
  Tensor cpu_rng, device_rng;
  bool autocast_gpu = false, autocast_cpu = false;
  at::ScalarType autocast_gpu_dtype = at::kHalf, autocast_cpu_dtype = at::kBFloat16;
};

struct BlockRef : ::torch::CustomClassHolder {
  ::torch::nn::Module* block = nullptr;
};

Tensor rng_state(const ::torch::Device& d) {
  auto gen = at::globalContext().defaultGenerator(d);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const ::torch::Device& d, const Tensor& state) {
  auto gen = at::globalContext().defaultGenerator(d);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Runs the state's RNG and autocast settings for the span of a recompute.
class RecomputeScope {
 public:
  explicit RecomputeScope(const CheckpointState& s)
      : s_(s),
        cpu_rng_(rng_state(::torch::kCPU)),
        autocast_gpu_(at::autocast::is_enabled()),
        autocast_cpu_(at::autocast::is_cpu_enabled()),
        gpu_dtype_(at::autocast::get_autocast_gpu_dtype()),
        cpu_dtype_(at::autocast::get_autocast_cpu_dtype()) {
    if (s.device_rng.defined()) device_rng_ = rng_state(s.device);
    set_rng_state(::torch::kCPU, s.cpu_rng);
    if (s.device_rng.defined()) set_rng_state(s.device, s.device_rng);
    at::autocast::set_enabled(s.autocast_gpu);
    at::autocast::set_cpu_enabled(s.autocast_cpu);
    at::autocast::set_autocast_gpu_dtype(s.autocast_gpu_dtype);
    at::autocast::set_autocast_cpu_dtype(s.autocast_cpu_dtype);
  }
  ~RecomputeScope() {
    set_rng_state(::torch::kCPU, cpu_rng_);
    if (device_rng_.defined()) set_rng_state(s_.device, device_rng_);
    at::autocast::set_enabled(autocast_gpu_);
    at::autocast::set_cpu_enabled(autocast_cpu_);
    at::autocast::set_autocast_gpu_dtype(gpu_dtype_);
    at::autocast::set_autocast_cpu_dtype(cpu_dtype_);
  }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  const CheckpointState& s_;
  Tensor cpu_rng_, device_rng_;
  bool autocast_gpu_, autocast_cpu_;
  at::ScalarType gpu_dtype_, cpu_dtype_;
};

// y = fn(x) without a graph; backward recomputes fn(x) with one and
// backpropagates through it. `anchor` is an empty tensor that requires grad
// when x does not, so that the block's parameters still get gradients.
struct CheckpointFunction : ::torch::autograd::Function<CheckpointFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& /*anchor*/,
                        c10::intrusive_ptr<CheckpointState> state) {
    state->cpu_rng = rng_state(::torch::kCPU);
    if (x.device().type() != ::torch::kCPU) {
      state->device = x.device();
      state->device_rng = rng_state(x.device());
    }
    state->autocast_gpu = at::autocast::is_enabled();
    state->autocast_cpu = at::autocast::is_cpu_enabled();
    state->autocast_gpu_dtype = at::autocast::get_autocast_gpu_dtype();
    state->autocast_cpu_dtype = at::autocast::get_autocast_cpu_dtype();
    Tensor y;
    {
      ::torch::NoGradGuard ng;
      y = state->fn(x);
    }
    ctx->save_for_backward({x});
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    auto saved = ctx->get_saved_variables();
    const Tensor& x = saved[0];
    Tensor xd = x.detach();
    xd.requires_grad_(x.requires_grad());

    std::vector<Tensor> buffers, kept;
    {
      ::torch::NoGradGuard ng;
      for (auto& b : state->block->buffers())
        if (b.defined()) {
          buffers.push_back(b);
          kept.push_back(b.clone());
        }
    }
    Tensor y;
    {
      RecomputeScope scope(*state);
      ::torch::AutoGradMode on(true);
      y = state->fn(xd);
    }
    if (y.requires_grad()) {
      Tensor g = grads[0].defined() ? grads[0] : ::torch::zeros_like(y);
      ::torch::autograd::backward({y}, {g});
    }
    {
      ::torch::NoGradGuard ng;  // after backward: batch_norm's backward saved the running stats
      for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(kept[i]);
    }
    Tensor gx = x.requires_grad() ? xd.grad() : Tensor();
    return {gx, Tensor(), Tensor()};
  }
};

// Identity whose backward tells the block's observers that its backward is
// about to run (and, with recompute, its recomputation).
struct BeforeBackward : ::torch::autograd::Function<BeforeBackward> {
  static Tensor forward(AutogradContext* ctx, const Tensor& y, c10::intrusive_ptr<BlockRef> ref) {
    ctx->saved_data["block"] = c10::IValue::make_capsule(std::move(ref));
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto ref = c10::static_intrusive_pointer_cast<BlockRef>(ctx->saved_data["block"].toCapsule());
    for (auto* o : owners_of(*ref->block)) o->before_backward(*ref->block);
    return {grads[0], Tensor()};
  }
};

}  // namespace

void add_block_observer(BlockObserver* observer) {
  if (!observer) throw InvalidUsage("add_block_observer: the observer is null");
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  if (std::find(r.begin(), r.end(), observer) == r.end()) r.push_back(observer);
}

void remove_block_observer(BlockObserver* observer) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  r.erase(std::remove(r.begin(), r.end(), observer), r.end());
}

::torch::Tensor checkpoint(::torch::nn::Module& block, const BlockFn& fn, const ::torch::Tensor& x) {
  if (!::torch::GradMode::is_enabled()) return fn(x);
  Tensor anchor = ::torch::empty({0}, x.options());
  if (!x.requires_grad()) {
    bool any = false;
    for (const auto& p : block.parameters())
      if (p.requires_grad()) any = true;
    if (!any) return fn(x);
    anchor.requires_grad_(true);
  }
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->block = &block;
  return CheckpointFunction::apply(x, anchor, std::move(state));
}

::torch::Tensor run_block(::torch::nn::Module& block, const BlockFn& fn, const ::torch::Tensor& x) {
  auto owners = owners_of(block);
  if (owners.empty()) return fn(x);
  for (auto* o : owners) o->before_forward(block);
  const bool grad = ::torch::GradMode::is_enabled();
  bool rc = false;
  for (auto* o : owners)
    if (o->recompute(block)) rc = true;
  Tensor y = (rc && grad) ? checkpoint(block, fn, x) : fn(x);
  for (auto* o : owners) o->after_forward(block);
  if (grad && y.requires_grad()) {
    auto ref = c10::make_intrusive<BlockRef>();
    ref->block = &block;
    y = BeforeBackward::apply(y, std::move(ref));
  }
  return y;
}

namespace {

class RecomputeObserver : public BlockObserver {
 public:
  RecomputeObserver(const std::shared_ptr<::torch::nn::Module>& model, const std::vector<std::string>& checkpoints)
      : all_(checkpoints.empty()) {
    for (const auto& m : model->modules(/*include_self=*/true)) mine_.insert(m.get());
    std::unordered_map<std::string, const ::torch::nn::Module*> by_name;
    for (const auto& item : model->named_modules("", /*include_self=*/false)) by_name[item.key()] = item.value().get();
    for (const auto& name : checkpoints) {
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        std::ostringstream os;
        os << "strategy.recompute_configs.checkpoints: '" << name << "' is not a module of the model; its top-level "
           << "modules are [";
        bool first = true;
        for (const auto& c : model->named_children()) {
          os << (first ? "" : ", ") << '"' << c.key() << '"';
          first = false;
        }
        os << "] (name blocks as model.named_modules() does, e.g. \"blocks.0\")";
        throw InvalidUsage(os.str());
      }
      chosen_.insert(it->second);
    }
  }

  bool owns(const ::torch::nn::Module& block) const override { return mine_.count(&block) != 0; }
  bool recompute(const ::torch::nn::Module& block) const override { return all_ || chosen_.count(&block) != 0; }

 private:
  bool all_;
  std::unordered_set<const ::torch::nn::Module*> mine_, chosen_;
};

}  // namespace

std::unique_ptr<BlockObserver> make_recompute_observer(const std::shared_ptr<::torch::nn::Module>& model,
                                                       const std::vector<std::string>& checkpoints) {
  if (!model) throw InvalidUsage("make_recompute_observer: the model is null");
  return std::make_unique<RecomputeObserver>(model, checkpoints);
}

}  // namespace dtrain::fleet
