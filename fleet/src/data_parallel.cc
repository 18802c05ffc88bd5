#include "dtrain/fleet/data_parallel.h"

#include <cstdlib>
#include <cstring>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/fleet/blocks.h"
#include "dtrain/fleet/sharding.h"
#include "dtrain/fleet/sync_batch_norm.h"
#include "gradient_sync.h"
#include "tensor_buffer.h"

namespace dtrain::fleet {

namespace {

using detail::device_view;
using detail::f32_view;

// Testing only: DTRAIN_TORCH_DEVICE_BUCKETS=1 runs CPU parameters through the
// CUDA path (its buckets, broadcasts and fp16 compression; tensors on the CPU,
// buffers on the host), so that path's logic is tested on machines without a
// GPU (tests/fleet/data_parallel_device_test.cc).
bool device_path_forced() {
  const char* v = std::getenv("DTRAIN_TORCH_DEVICE_BUCKETS");
  return v && std::strcmp(v, "1") == 0;
}

}  // namespace

struct DataParallel::Hook : ::torch::autograd::FunctionPostHook {
  Hook(DataParallel* owner, size_t index) : owner(owner), index(index) {}
  ::torch::autograd::variable_list operator()(const ::torch::autograd::variable_list& outputs,
                                              const ::torch::autograd::variable_list& /*inputs*/) override {
    owner->on_grad_ready(index);
    return outputs;
  }
  DataParallel* owner;
  size_t index;
};

// The composition: the parameters' layout (whole, or ZeRO-sharded by
// ShardedParameters) and the gradient reduction (gradient_sync.h), chosen
// here once; recompute and SyncBatchNorm hook into the model.
DataParallel::DataParallel(std::shared_ptr<::torch::nn::Module> model, std::shared_ptr<Communicator> comm,
                           const StrategyOptions& options)
    : model_(std::move(model)), comm_(std::move(comm)), strategy_(options) {
  if (!model_) throw InvalidUsage("DataParallel: the model is null");
  collect_parameters();
  if (options.recompute) {
    recompute_ = make_recompute_observer(model_, options.recompute_checkpoints);
    add_block_observer(recompute_.get());
  }
  if (options.sync_batch_norm && world_size() > 1) enable_sync_batch_norm(*model_, comm_);
  on_device_ = cuda_ || device_path_forced();
  if (world_size() > 1) broadcast_state();
  if (options.sharding) sharded_ = std::make_unique<ShardedParameters>(model_, params_, param_names_, comm_, options);
  if (sharded_ && sharded_->stage() >= 2)
    sync_ = sharded_gradients(*sharded_);
  else if (world_size() > 1)
    sync_ = on_device_ ? device_buckets(params_, comm_, options) : host_buckets(params_, comm_, options);
  if (sync_) register_hooks();
}

// All trainable parameters on the CPU, or all on one CUDA device.
void DataParallel::collect_parameters() {
  for (auto& kv : model_->named_parameters())
    if (kv.value().requires_grad()) {
      params_.push_back(kv.value());
      param_names_.push_back(kv.key());
    }
  cuda_ = !params_.empty() && params_[0].is_cuda();
  const ::torch::Device device = cuda_ ? params_[0].device() : ::torch::Device(::torch::kCPU);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    if (p.scalar_type() != ::torch::kFloat32 || !p.is_non_overlapping_and_dense() || p.device() != device)
      throw NotSupported(
          "data parallelism needs dense float32 parameters (contiguous or channels-last), all on the CPU or all "
          "on one CUDA device (here " +
          device.str() + "); '" + param_names_[i] + "' is " + std::string(c10::toString(p.scalar_type())) + " on " +
          p.device().str());
  }
}

// Every rank built the same model; rank 0's parameters and buffers win.
void DataParallel::broadcast_state() {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (auto& kv : model_->named_parameters()) {
    names.push_back(kv.key());
    shapes.push_back(kv.value().sizes().vec());
  }
  for (auto& kv : model_->named_buffers()) {
    names.push_back(kv.key());
    shapes.push_back(kv.value().sizes().vec());
  }
  check_same_layout(*comm_, names, shapes);
  ::torch::NoGradGuard ng;
  std::vector<::torch::Tensor> state = model_->parameters();
  for (auto& b : model_->buffers())
    if (b.scalar_type() == ::torch::kFloat32 || b.scalar_type() == ::torch::kInt64) state.push_back(b);
  if (on_device_) {
    // One broadcast per tensor: the core's packed broadcast_buffers copies through host memory.
    for (auto& t : state) comm_->broadcast(device_view(t), 0)->wait();
    return;
  }
  std::vector<Buffer> bufs;
  for (auto& t : state) bufs.push_back(device_view(t));
  broadcast_buffers(*comm_, bufs, 0, strategy_.options().bucket_bytes());
}

void DataParallel::register_hooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = ::torch::autograd::impl::grad_accumulator(params_[i]);
    acc->add_post_hook(std::make_unique<Hook>(this, i));
    accumulators_.push_back(std::move(acc));
  }
}

void DataParallel::average_on_device(const std::vector<::torch::Tensor>& tensors) {
  ::torch::NoGradGuard ng;
  std::vector<std::shared_ptr<Work>> works;
  for (auto& t : tensors) works.push_back(comm_->allreduce(device_view(t), ReduceOp::Avg));
  for (auto& w : works) w->wait();
  extra_.allreduces += works.size();
}

DataParallel::~DataParallel() {
  if (recompute_) remove_block_observer(recompute_.get());
}

int DataParallel::world_size() const { return comm_ ? comm_->size() : 1; }

void DataParallel::begin_step(int64_t step) {
  armed_ = sync_ && sync_->syncs_at(strategy_, step);
  if (armed_ && !begun_) {
    sync_->begin();
    begun_ = true;
    marked_.assign(params_.size(), 0);
  }
}

void DataParallel::on_grad_ready(size_t index) {
  if (!armed_) return;
  if (marked_[index]++)
    throw InvalidUsage(
        "DataParallel: parameter '" + param_names_[index] +
        "' got a gradient from a second backward in the same step, while the first one's is being "
        "all-reduced; run one backward per optimizer step, or accumulate over several with the "
        "gradient_merge strategy ([strategy.gradient_merge] k_steps, StrategyOptions::gradient_merge_k_steps)");
  sync_->ready(index);
}

void DataParallel::end_backward(int64_t step) {
  if (armed_) {
    sync_->finish();
    armed_ = false;
    begun_ = false;
  }
  if (sync_ && sync_->into_shards()) return;
  double scale = strategy_.gradient_scale();
  if (scale != 1.0 && strategy_.optimizer_step_at(step)) {
    ::torch::NoGradGuard ng;
    for (auto& p : params_)
      if (p.grad().defined()) p.mutable_grad().mul_(scale);
  }
  if (sharded_ && strategy_.optimizer_step_at(step)) sharded_->take_full_gradients();
}

void DataParallel::after_optimizer_step(int64_t step) {
  if (sharded_) return sharded_->after_step();
  if (world_size() > 1 && strategy_.average_parameters_at(step)) {
    if (cuda_) return average_on_device(params_);
    ::torch::NoGradGuard ng;
    std::vector<Buffer> bufs;
    for (auto& p : params_) bufs.push_back(f32_view(p));
    ::dtrain::average_buffers(*comm_, bufs, strategy_.options().bucket_bytes(), &extra_);
  }
}

void DataParallel::average_buffers() {
  if (world_size() <= 1) return;
  if (cuda_) {
    std::vector<::torch::Tensor> fl;
    for (auto& b : model_->buffers())
      if (b.scalar_type() == ::torch::kFloat32) fl.push_back(b);
    return average_on_device(fl);
  }
  ::torch::NoGradGuard ng;
  std::vector<Buffer> bufs;
  for (auto& b : model_->buffers())
    if (b.scalar_type() == ::torch::kFloat32) bufs.push_back(f32_view(b));
  ::dtrain::average_buffers(*comm_, bufs, strategy_.options().bucket_bytes(), &extra_);
}

void DataParallel::allreduce_sum(std::vector<double>& values) {
  if (world_size() <= 1 || values.empty()) return;
  comm_->allreduce(Buffer::of(values.data(), values.size()), ReduceOp::Sum, CallOptions::wait_now());
}

SyncStats DataParallel::stats() const {
  SyncStats s = extra_;
  if (sharded_) {
    s.wait_seconds += sharded_->stats().wait_seconds;
    s.allreduces += sharded_->stats().allreduces;
    s.bytes_on_wire += sharded_->stats().bytes_on_wire;
  }
  if (sync_) {
    s.wait_seconds += sync_->stats().wait_seconds;
    s.allreduces += sync_->stats().allreduces;
    s.bytes_on_wire += sync_->stats().bytes_on_wire;
  }
  return s;
}

void DataParallel::reset_stats() {
  extra_ = {};
  if (sharded_) sharded_->reset_stats();
  if (sync_) sync_->reset_stats();
}

}  // namespace dtrain::fleet
