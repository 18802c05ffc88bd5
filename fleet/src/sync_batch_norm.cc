#include "dtrain/torch/sync_batch_norm.h"

#include <torch/csrc/autograd/custom_function.h>

#include <string>
#include <utility>

#include "dtrain/error.h"
#include "tensor_buffer.h"

namespace dtrain::torch {

namespace {

using ::torch::Tensor;
using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

struct SyncState : ::torch::CustomClassHolder {
  std::shared_ptr<Communicator> comm;
  double count = 0;  // elements per channel over all ranks
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

// Input 0 the activations [N, C, H, W], 1 and 2 weight and bias (empty
// without affine). Running statistics move in forward.
struct SyncBatchNormFunction : ::torch::autograd::Function<SyncBatchNormFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        RunningStats running, double momentum, double eps, std::shared_ptr<Communicator> comm) {
    Tensor &running_mean = running.mean, &running_var = running.var;
    const int64_t local = x.numel() / std::max<int64_t>(x.size(1), 1);
    Tensor packed =
        ::torch::cat({x.sum({0, 2, 3}, false, ::torch::kDouble), x.square().sum({0, 2, 3}, false, ::torch::kDouble),
                      ::torch::full({1}, static_cast<double>(local), x.options().dtype(::torch::kDouble))})
            .contiguous();
    allreduce_sum(*comm, packed);
    const int64_t c = x.size(1);
    const double n = packed[2 * c].item<double>();
    if (n <= 1)
      throw InvalidUsage("SyncBatchNorm: expected more than 1 value per channel over all ranks when training, got " +
                         std::to_string(static_cast<int64_t>(n)));
    Tensor mean = packed.slice(0, 0, c) / n;
    Tensor var = (packed.slice(0, c, 2 * c) / n - mean.square()).clamp_min(0);
    Tensor invstd = (var + eps).rsqrt();
    if (running_mean.defined()) {
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((var * (n / (n - 1))).to(running_var.scalar_type()), momentum);
    }
    Tensor mean_x = mean.to(x.scalar_type()), invstd_x = invstd.to(x.scalar_type());
    Tensor y = (x - per_channel(mean_x)) * per_channel(invstd_x);
    if (weight.numel() > 0) y = y * per_channel(weight) + per_channel(bias);
    ctx->save_for_backward({x, weight, mean_x, invstd_x});
    auto state = c10::make_intrusive<SyncState>();
    state->comm = std::move(comm);
    state->count = n;
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = c10::static_intrusive_pointer_cast<SyncState>(ctx->saved_data["state"].toCapsule());
    auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3];
    Tensor dy = grads[0].defined() ? grads[0] : ::torch::zeros_like(x);
    Tensor xhat = (x - per_channel(mean)) * per_channel(invstd);
    Tensor sum_dy = dy.sum({0, 2, 3}, false, ::torch::kDouble);
    Tensor sum_dy_xhat = (dy * xhat).sum({0, 2, 3}, false, ::torch::kDouble);
    Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) {
      const int64_t c = x.size(1);
      Tensor packed = ::torch::cat({sum_dy, sum_dy_xhat}).contiguous();
      allreduce_sum(*state->comm, packed);
      Tensor mean_dy = (packed.slice(0, 0, c) / state->count).to(x.scalar_type());
      Tensor mean_dy_xhat = (packed.slice(0, c, 2 * c) / state->count).to(x.scalar_type());
      Tensor scale = weight.numel() > 0 ? invstd * weight : invstd;
      gx = (dy - per_channel(mean_dy) - xhat * per_channel(mean_dy_xhat)) * per_channel(scale);
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
  stream << std::boolalpha << "dtrain::torch::BatchNorm2d(" << options.num_features() << ", eps=" << options.eps()
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
                         "build it as dtrain::torch::BatchNorm2d (dtrain/torch/sync_batch_norm.h), a drop-in with "
                         "the same parameters and buffers");
    }
  }
  for (auto* bn : found) bn->set_communicator(comm);
  return static_cast<int>(found.size());
}

}  // namespace dtrain::torch
