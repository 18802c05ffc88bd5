#include "dtrain/fleet/sync_batch_norm.h"

#include <torch/csrc/autograd/custom_function.h>

#include <string>
#include <utility>

#include "dtrain/error.h"
#include "tensor_buffer.h"

namespace dtrain::fleet {

namespace {

using ::torch::Tensor;
using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

struct SyncState : ::torch::CustomClassHolder {
  std::shared_ptr<Communicator> comm;
  double count = 0;  // elements per channel over all ranks
  double eps = 0;
};

// Sums `packed` (a contiguous tensor) over the ranks, in place.
void allreduce_sum(Communicator& comm, Tensor& packed) {
  comm.allreduce(detail::device_view(packed), ReduceOp::Sum, CallOptions::wait_now());
}

Tensor per_channel(const Tensor& t) { return t.view({1, -1, 1, 1}); }

// Not an input of the autograd function (which takes no undefined tensors).
struct RunningStats {
  Tensor mean, var;  // undefined without track_running_stats
};

// Statistics and normalization run in float at least (half and bfloat16
// activations are widened), with ATen's fused kernels: one pass for the local
// mean and variance, one to normalize; backward one pass for the two sums
// and two for the input gradient.
Tensor widened(const Tensor& t) {
  auto st = t.scalar_type();
  return st == ::torch::kHalf || st == ::torch::kBFloat16 ? t.to(::torch::kFloat) : t;
}

Tensor defined_or_none(const Tensor& t) { return t.numel() > 0 ? t : Tensor(); }

// Input 0 the activations [N, C, H, W], 1 and 2 weight and bias (empty
// without affine). Running statistics move in forward.
struct SyncBatchNormFunction : ::torch::autograd::Function<SyncBatchNormFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        RunningStats running, double momentum, double eps, std::shared_ptr<Communicator> comm) {
    Tensor &running_mean = running.mean, &running_var = running.var;
    const int64_t c = x.size(1);
    const double local = static_cast<double>(x.numel() / std::max<int64_t>(c, 1));
    Tensor xw = widened(x);
    auto [local_var, local_mean] = ::torch::var_mean(xw, {0, 2, 3}, /*unbiased=*/false);
    Tensor m = local_mean.to(::torch::kDouble);
    // [sum, sum of squares, count] per channel, as the ranks add them up.
    Tensor packed = ::torch::cat({m * local, (local_var.to(::torch::kDouble) + m.square()) * local,
                                  ::torch::full({1}, local, m.options())})
                        .contiguous();
    allreduce_sum(*comm, packed);
    const double n = packed[2 * c].item<double>();
    if (n <= 1)
      throw InvalidUsage("SyncBatchNorm: expected more than 1 value per channel over all ranks when training, got " +
                         std::to_string(static_cast<int64_t>(n)));
    Tensor mean = packed.slice(0, 0, c) / n;
    Tensor var = (packed.slice(0, c, 2 * c) / n - mean.square()).clamp_min(0);
    if (running_mean.defined()) {
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((var * (n / (n - 1))).to(running_var.scalar_type()), momentum);
    }
    Tensor mean_w = mean.to(xw.scalar_type()), var_w = var.to(xw.scalar_type());
    // Eval-mode batch norm normalizes with the statistics it is given: the global ones.
    Tensor y = ::torch::batch_norm(xw, defined_or_none(weight), defined_or_none(bias), mean_w, var_w,
                                   /*training=*/false, 0.0, eps, /*cudnn_enabled=*/true);
    ctx->save_for_backward({x, weight, mean_w, var_w});
    auto state = c10::make_intrusive<SyncState>();
    state->comm = std::move(comm);
    state->count = n;
    state->eps = eps;
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return y.scalar_type() == x.scalar_type() ? y : y.to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = c10::static_intrusive_pointer_cast<SyncState>(ctx->saved_data["state"].toCapsule());
    auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &var = saved[3];
    Tensor xw = widened(x);
    Tensor dy = grads[0].defined() ? widened(grads[0]).contiguous() : ::torch::zeros_like(xw);
    const int64_t c = x.size(1);
    // The eval-mode backward's weight and bias gradients are this rank's
    // sum(dy * xhat) and sum(dy) under the given statistics; it needs a weight.
    Tensor w = weight.numel() > 0 ? weight.to(xw.scalar_type()) : ::torch::ones({c}, xw.options());
    auto sums = ::at::native_batch_norm_backward(dy, xw, w, mean, var, {}, {}, /*train=*/false, state->eps,
                                                 {false, true, true});
    Tensor sum_dy_xhat = std::get<1>(sums), sum_dy = std::get<2>(sums);
    Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) {
      Tensor packed = ::torch::cat({sum_dy.to(::torch::kDouble), sum_dy_xhat.to(::torch::kDouble)}).contiguous();
      allreduce_sum(*state->comm, packed);
      Tensor mean_dy = packed.slice(0, 0, c) / state->count;
      Tensor mean_dy_xhat = packed.slice(0, c, 2 * c) / state->count;
      // gx = (dy - mean_dy - xhat * mean_dy_xhat) * invstd * w, with xhat = (x - mean) * invstd,
      // as a * dy + b * x + k per channel.
      Tensor invstd = (var.to(::torch::kDouble) + state->eps).rsqrt();
      Tensor a = invstd * w.to(::torch::kDouble);
      Tensor b = -a * invstd * mean_dy_xhat;
      Tensor k = -a * mean_dy - b * mean.to(::torch::kDouble);
      auto st = xw.scalar_type();
      gx = ::torch::addcmul(per_channel(k.to(st)), xw, per_channel(b.to(st)));
      gx.addcmul_(dy, per_channel(a.to(st)));
      if (gx.scalar_type() != x.scalar_type()) gx = gx.to(x.scalar_type());
    }
    if (weight.numel() > 0 && ctx->needs_input_grad(1)) gw = sum_dy_xhat.to(weight.scalar_type());
    if (weight.numel() > 0 && ctx->needs_input_grad(2)) gb = sum_dy.to(weight.scalar_type());
    return {gx, gw, gb, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

}  // namespace

BatchNorm2dImpl::BatchNorm2dImpl(const ::torch::nn::BatchNormOptions& options)
    : ::torch::nn::NormImplBase<2, BatchNorm2dImpl, ::torch::nn::BatchNormOptions>(options) {}

bool BatchNorm2dImpl::synchronized() const { return comm_ && comm_->size() > 1; }

void BatchNorm2dImpl::_check_input_dim(const ::torch::Tensor& input) {
  TORCH_CHECK(input.dim() == 4, "expected 4D input (got ", input.dim(), "D input)");
}

::torch::Tensor BatchNorm2dImpl::forward(const ::torch::Tensor& input) {
  _check_input_dim(input);
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats() && num_batches_tracked.defined()) {
    num_batches_tracked += 1;
    if (!options.momentum()) factor = 1.0 / num_batches_tracked.item<double>();
  }
  if (!is_training() || !synchronized())
    return ::torch::nn::functional::detail::batch_norm(input, running_mean, running_var, weight, bias,
                                                       is_training() || !options.track_running_stats(), factor,
                                                       options.eps());
  const Tensor none = ::torch::empty({0}, input.options());
  return SyncBatchNormFunction::apply(input, weight.defined() ? weight : none, bias.defined() ? bias : none,
                                      RunningStats{running_mean, running_var}, factor, options.eps(), comm_);
}

void BatchNorm2dImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "dtrain::fleet::BatchNorm2d(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum())
    stream << *options.momentum();
  else
    stream << "None";
  stream << ", affine=" << options.affine() << ", track_running_stats=" << options.track_running_stats()
         << (synchronized() ? ", synchronized" : "") << ")";
}

int enable_sync_batch_norm(::torch::nn::Module& model, std::shared_ptr<Communicator> comm) {
  std::vector<BatchNorm2dImpl*> found;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    auto* m = item.value().get();
    if (auto* bn = dynamic_cast<BatchNorm2dImpl*>(m)) {
      found.push_back(bn);
      continue;
    }
    const char* plain = nullptr;
    if (dynamic_cast<::torch::nn::BatchNorm1dImpl*>(m))
      plain = "torch::nn::BatchNorm1d";
    else if (dynamic_cast<::torch::nn::BatchNorm2dImpl*>(m))
      plain = "torch::nn::BatchNorm2d";
    else if (dynamic_cast<::torch::nn::BatchNorm3dImpl*>(m))
      plain = "torch::nn::BatchNorm3d";
    if (plain) {
      const std::string name = item.key().empty() ? std::string("the model itself") : "'" + item.key() + "'";
      throw InvalidUsage("strategy.sync_batch_norm: module " + name + " is a plain " + plain +
                         ", which cannot synchronize its statistics (libtorch modules cannot be replaced in place); "
                         "build it as dtrain::fleet::BatchNorm2d (dtrain/fleet/sync_batch_norm.h), a drop-in with "
                         "the same parameters and buffers");
    }
  }
  for (auto* bn : found) bn->set_communicator(comm);
  return static_cast<int>(found.size());
}

}  // namespace dtrain::fleet
