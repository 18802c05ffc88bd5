#pragma once

#include <memory>
#include <ostream>

#include <torch/torch.h>

#include "dtrain/communicator.h"

// SyncBatchNorm: batch normalization whose training statistics are those of
// the global batch (every rank's samples), as PyTorch's
// torch.nn.SyncBatchNorm.
//
// dtrain::fleet::BatchNorm2d is a drop-in for torch::nn::BatchNorm2d: the
// same options (BatchNormOptions: eps 1e-5, momentum 0.1, affine,
// track_running_stats), the same parameters and buffers in the same order
// (weight, bias, running_mean, running_var, num_batches_tracked), so
// checkpoints load either way. Without a communicator, with one of size 1,
// or in eval mode it computes exactly what torch::nn::BatchNorm2d does. With
// a communicator of several ranks and in training mode it is SyncBatchNorm:
//  - forward all-reduces per-channel [sum, sum of squares, count] (one
//    blocking allreduce of 2C+1 doubles), normalizes with the global mean and
//    biased variance, and moves the running statistics with the global mean
//    and unbiased variance;
//  - backward all-reduces per-channel [sum(dy), sum(dy * xhat)] (2C values)
//    to form the input gradient; the weight and bias gradients are this
//    rank's own sums. With each rank's loss a mean over its own samples and
//    DataParallel averaging the parameter gradients, the step equals one
//    process on the concatenated batch (as PyTorch's SyncBatchNorm + DDP).
//
// libtorch modules cannot be swapped in place (their owners hold typed
// ModuleHolders), so a model that wants SyncBatchNorm builds its
// normalization layers as dtrain::fleet::BatchNorm2d from the start.
//
// Threads: every rank runs forward and backward of its BatchNorm2d layers in
// the same order (the collectives pair up by order); the communicator is
// used from the forward thread and from autograd's backward thread, one op
// at a time, like DataParallel's gradient allreduces on the same
// communicator.
namespace dtrain::fleet {

class BatchNorm2dImpl : public ::torch::nn::NormImplBase<2, BatchNorm2dImpl, ::torch::nn::BatchNormOptions> {
 public:
  explicit BatchNorm2dImpl(int64_t num_features) : BatchNorm2dImpl(::torch::nn::BatchNormOptions(num_features)) {}
  explicit BatchNorm2dImpl(const ::torch::nn::BatchNormOptions& options);

  ::torch::Tensor forward(const ::torch::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

  // Sets (or, with nullptr, clears) the communicator of the ranks whose
  // batches are normalized together. The module shares ownership.
  void set_communicator(std::shared_ptr<Communicator> comm) { comm_ = std::move(comm); }
  const std::shared_ptr<Communicator>& communicator() const { return comm_; }
  // Whether forward in training mode synchronizes (a communicator of size > 1).
  bool synchronized() const;

 protected:
  void _check_input_dim(const ::torch::Tensor& input) override;

 private:
  std::shared_ptr<Communicator> comm_;
};

// The holder, as TORCH_MODULE(BatchNorm2d) would declare it (the macro names
// torch::nn unqualified, which inside dtrain::fleet means this namespace).
class BatchNorm2d : public ::torch::nn::ModuleHolder<BatchNorm2dImpl> {
 public:
  using ::torch::nn::ModuleHolder<BatchNorm2dImpl>::ModuleHolder;
  using Impl = BatchNorm2dImpl;
};

// Sets `comm` on every dtrain::fleet::BatchNorm2d of `model` and returns how
// many there are. A plain torch::nn::BatchNorm1d/2d/3d in the model is an
// InvalidUsage naming it (build it as dtrain::fleet::BatchNorm2d instead).
int enable_sync_batch_norm(::torch::nn::Module& model, std::shared_ptr<Communicator> comm);

}  // namespace dtrain::fleet
