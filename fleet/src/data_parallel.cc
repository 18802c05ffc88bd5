#include "dtrain/fleet/data_parallel.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/fleet/blocks.h"
#include "dtrain/fleet/sharding.h"
#include "dtrain/fleet/sync_batch_norm.h"
#include "tensor_buffer.h"

namespace dtrain::fleet {

namespace {

Buffer f32_view(const ::torch::Tensor& t) {
  return Buffer(t.data_ptr<float>(), static_cast<size_t>(t.numel()), DType::F32);
}

// Parameter p's gradient as a view of its place in a host bucket, with p's
// strides (a channels-last weight gets a channels-last gradient in place).
::torch::Tensor host_slot_view(float* slot, const ::torch::Tensor& p) {
  return ::torch::from_blob(slot, p.sizes(), p.strides(), p.options().requires_grad(false));
}

using detail::device_view;

// Testing only: DTRAIN_TORCH_DEVICE_BUCKETS=1 runs CPU parameters through the
// CUDA path (its buckets, broadcasts and fp16 compression; tensors on the CPU,
// buffers on the host), so that path's logic is tested on machines without a
// GPU (tests/fleet/data_parallel_device_test.cc).
bool device_path_forced() {
  const char* v = std::getenv("DTRAIN_TORCH_DEVICE_BUCKETS");
  return v && std::strcmp(v, "1") == 0;
}

}  // namespace

// Gradient buckets in CUDA memory (the CPU path uses the core's
// GradientBuckets, which are host memory): the same grouping (reverse
// registration order, up to bucket_bytes), gradients as views of the
// buckets, each bucket all-reduced (average) as a CUDA buffer on the current
// stream as soon as its last gradient is in, in bucket order on every rank.
// With fp16_allreduce a bucket travels as f16 or bf16, as c10d's fp16
// compression hook and the CPU path do: divided by the world size, cast (a
// kernel on the current stream, which the all-reduce follows), summed, and
// widened back into the bucket in finish().
struct DataParallel::CudaBuckets {
  struct Bucket {
    ::torch::Tensor flat;
    ::torch::Tensor wire;  // the 16-bit copy in flight (fp16_allreduce)
    std::vector<size_t> members;
    size_t pending = 0;
    std::shared_ptr<Work> work;
  };
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;
  std::vector<::torch::Tensor> slots;  // tensor i's view in its bucket
  std::vector<char> ready;
  size_t next_launch = 0;
  std::mutex mu;
  SyncStats stats;
  ::torch::ScalarType wire = ::torch::kFloat32;  // kHalf or kBFloat16 with fp16_allreduce

  CudaBuckets(const std::vector<::torch::Tensor>& params, size_t cap_bytes, const StrategyOptions& options) {
    if (options.fp16_allreduce) wire = options.wire_dtype == DType::BF16 ? ::torch::kBFloat16 : ::torch::kHalf;
    size_t n = params.size();
    bucket_of.assign(n, 0);
    slots.resize(n);
    std::vector<std::vector<size_t>> groups(1);
    size_t bytes = 0;
    for (size_t k = n; k-- > 0;) {
      size_t b = static_cast<size_t>(params[k].numel()) * sizeof(float);
      if (!groups.back().empty() && bytes + b > cap_bytes) {
        groups.emplace_back();
        bytes = 0;
      }
      groups.back().push_back(k);
      bytes += b;
    }
    for (auto& g : groups) {
      if (g.empty()) continue;
      int64_t count = 0;
      for (size_t i : g) count += params[i].numel();
      Bucket bk;
      bk.flat = ::torch::zeros({count}, params[g[0]].options().requires_grad(false));
      bk.members = g;
      int64_t off = 0;
      for (size_t i : g) {
        bucket_of[i] = buckets.size();
        slots[i] = bk.flat.narrow(0, off, params[i].numel()).view(params[i].sizes());
        off += params[i].numel();
      }
      buckets.push_back(std::move(bk));
    }
  }
  void begin() {
    std::lock_guard<std::mutex> lk(mu);
    ready.assign(slots.size(), 0);
    for (auto& b : buckets) b.pending = b.members.size();
    next_launch = 0;
  }
  void mark_ready(Communicator& comm, size_t i, const ::torch::Tensor& g) {
    std::lock_guard<std::mutex> lk(mu);
    if (ready[i]) return;
    ready[i] = 1;
    if (g.data_ptr() != slots[i].data_ptr()) {
      ::torch::NoGradGuard ng;
      slots[i].copy_(g);
    }
    --buckets[bucket_of[i]].pending;
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      auto& b = buckets[next_launch++];
      stats.allreduces++;
      if (wire == ::torch::kFloat32) {
        b.work = comm.allreduce(device_view(b.flat), ReduceOp::Avg);
        stats.bytes_on_wire += static_cast<double>(b.flat.numel()) * sizeof(float);
        continue;
      }
      ::torch::NoGradGuard ng;
      b.wire = b.flat.mul(1.0 / static_cast<double>(comm.size())).to(wire);
      b.work = comm.allreduce(device_view(b.wire), ReduceOp::Sum);
      stats.bytes_on_wire += static_cast<double>(b.flat.numel()) * sizeof(uint16_t);
    }
  }
  void finish() {
    auto t0 = std::chrono::steady_clock::now();
    for (auto& b : buckets)
      if (b.work) {
        b.work->wait();
        b.work.reset();
      }
    stats.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ::torch::NoGradGuard ng;
    for (auto& b : buckets)
      if (b.wire.defined()) {
        b.flat.copy_(b.wire);
        b.wire = ::torch::Tensor();
      }
  }
};

struct DataParallel::Hook : ::torch::autograd::FunctionPostHook {
  Hook(DataParallel* owner, size_t index) : owner(owner), index(index) {}
  ::torch::autograd::variable_list operator()(const ::torch::autograd::variable_list& outputs,
                                              const ::torch::autograd::variable_list& /*inputs*/) override {
    owner->on_grad_ready(index, true);
    return outputs;
  }
  DataParallel* owner;
  size_t index;
};

DataParallel::DataParallel(std::shared_ptr<::torch::nn::Module> model, std::shared_ptr<Communicator> comm,
                           const StrategyOptions& options)
    : model_(std::move(model)), comm_(std::move(comm)), strategy_(options) {
  if (!model_) throw InvalidUsage("DataParallel: the model is null");
  for (auto& kv : model_->named_parameters())
    if (kv.value().requires_grad()) {
      params_.push_back(kv.value());
      param_names_.push_back(kv.key());
    }
  // All trainable parameters on the CPU, or all on one CUDA device.
  cuda_ = !params_.empty() && params_[0].is_cuda();
  for (auto& kv : model_->named_parameters()) {
    auto& p = kv.value();
    if (p.requires_grad() && (p.scalar_type() != ::torch::kFloat32 || !p.is_non_overlapping_and_dense() ||
                              p.device() != (cuda_ ? params_[0].device() : ::torch::Device(::torch::kCPU))))
      throw NotSupported(
          "data parallelism needs dense float32 parameters (contiguous or channels-last), all on the CPU or all "
          "on one CUDA "
          "device (here " +
          params_[0].device().str() + "); '" + kv.key() + "' is " + std::string(c10::toString(p.scalar_type())) +
          " on " + p.device().str());
  }
  if (options.recompute) {
    recompute_ = make_recompute_observer(model_, options.recompute_checkpoints);
    add_block_observer(recompute_.get());
  }
  if (options.sync_batch_norm && world_size() > 1) enable_sync_batch_norm(*model_, comm_);
  if (world_size() <= 1) {
    if (options.sharding) init_sharding(options);
    return;
  }

  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<Buffer> state;
  for (auto& kv : model_->named_parameters()) {
    names.push_back(kv.key());
    shapes.push_back(kv.value().sizes().vec());
  }
  for (auto& kv : model_->named_buffers()) {
    names.push_back(kv.key());
    shapes.push_back(kv.value().sizes().vec());
  }
  check_same_layout(*comm_, names, shapes);
  if (cuda_ || device_path_forced()) {
    init_cuda(options);
    return;
  }

  for (auto& p : model_->parameters()) state.push_back(f32_view(p));
  for (auto& b : model_->buffers()) {
    if (b.scalar_type() == ::torch::kFloat32)
      state.push_back(f32_view(b));
    else if (b.scalar_type() == ::torch::kInt64)
      state.push_back(Buffer(b.data_ptr<int64_t>(), static_cast<size_t>(b.numel()), DType::I64));
  }
  {
    ::torch::NoGradGuard ng;
    broadcast_buffers(*comm_, state, 0, options.bucket_bytes());
  }
  if (options.sharding && options.sharding_stage >= 2) {
    init_sharding(options);
    return;
  }

  std::vector<size_t> counts;
  for (auto& p : params_) counts.push_back(static_cast<size_t>(p.numel()));
  buckets_ = std::make_unique<GradientBuckets>(comm_, counts, options);
  // The gradients live in their buckets (c10d's gradient_as_bucket_view):
  // backward accumulates into the bucket and the all-reduce averages it in
  // place, with no copy in or out. zero_grad() zeroes in place and keeps the
  // view; a gradient replaced by another tensor is copied into the view once
  // and given it back (on_grad_ready).
  {
    ::torch::NoGradGuard ng;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      auto view = host_slot_view(buckets_->slot(i), p);
      if (p.grad().defined())
        view.copy_(p.grad());
      else
        view.zero_();
      p.mutable_grad() = view;
    }
  }
  register_hooks();
  if (options.sharding) sharded_ = std::make_unique<ShardedParameters>(model_, params_, param_names_, comm_, options);
}

void DataParallel::register_hooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = ::torch::autograd::impl::grad_accumulator(params_[i]);
    acc->add_post_hook(std::make_unique<Hook>(this, i));
    accumulators_.push_back(std::move(acc));
  }
}

// Stage 1 keeps the all-reduce buckets (set up by the caller); stages 2 and 3
// hand each gradient to the sharding's reduce-scatter buckets from the hook.
void DataParallel::init_sharding(const StrategyOptions& options) {
  sharded_ = std::make_unique<ShardedParameters>(model_, params_, param_names_, comm_, options);
  if (options.sharding_stage >= 2) register_hooks();
}

void DataParallel::init_cuda(const StrategyOptions& options) {
  {
    ::torch::NoGradGuard ng;
    // One broadcast per tensor: the core's packed broadcast_buffers copies through host memory.
    for (auto& p : model_->parameters()) comm_->broadcast(device_view(p), 0)->wait();
    for (auto& b : model_->buffers())
      if (b.scalar_type() == ::torch::kFloat32 || b.scalar_type() == ::torch::kInt64)
        comm_->broadcast(device_view(b), 0)->wait();
  }
  if (options.sharding && options.sharding_stage >= 2) return init_sharding(options);
  cuda_buckets_ =
      std::make_unique<CudaBuckets>(params_, options.fuse_all_reduce_ops ? options.bucket_bytes() : 0, options);
  {
    ::torch::NoGradGuard ng;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      auto& view = cuda_buckets_->slots[i];
      if (p.grad().defined()) view.copy_(p.grad());
      p.mutable_grad() = view;
    }
  }
  register_hooks();
  if (options.sharding) sharded_ = std::make_unique<ShardedParameters>(model_, params_, param_names_, comm_, options);
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
  if (cuda_buckets_) {
    ::torch::NoGradGuard ng;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      if (p.grad().defined() && p.grad().data_ptr() == cuda_buckets_->slots[i].data_ptr())
        p.mutable_grad() = p.grad().clone();
    }
  }
  if (!buckets_) return;
  // The bucket memory goes with this object: gradients still in it get their own.
  ::torch::NoGradGuard ng;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    if (p.grad().defined() && p.grad().data_ptr() == buckets_->slot(i)) p.mutable_grad() = p.grad().clone();
  }
}

int DataParallel::world_size() const { return comm_ ? comm_->size() : 1; }

bool DataParallel::reduce_scattering() const { return sharded_ && sharded_->stage() >= 2; }

void DataParallel::begin_step(int64_t step) {
  if (reduce_scattering()) {
    armed_ = true;
    if (!begun_) {
      sharded_->begin_step();
      begun_ = true;
      marked_.assign(params_.size(), 0);
    }
    return;
  }
  armed_ = (buckets_ || cuda_buckets_) && strategy_.sync_gradients_at(step);
  if (armed_ && !begun_) {
    if (cuda_buckets_)
      cuda_buckets_->begin();
    else
      buckets_->begin();
    begun_ = true;
    marked_.assign(params_.size(), 0);
  }
}

void DataParallel::on_grad_ready(size_t index, bool from_backward) {
  if (!armed_) return;
  if (from_backward && marked_[index]++)
    throw InvalidUsage(
        "DataParallel: parameter '" + param_names_[index] +
        "' got a gradient from a second backward in the same step, while the first one's is being "
        "all-reduced; run one backward per optimizer step, or accumulate over several with the "
        "gradient_merge strategy ([strategy.gradient_merge] k_steps, StrategyOptions::gradient_merge_k_steps)");
  if (reduce_scattering()) {
    if (from_backward) sharded_->on_grad_ready(index);
    return;
  }
  auto& p = params_[index];
  auto& g = p.mutable_grad();
  if (!g.defined()) return;
  // A gradient that replaced its bucket view (libtorch 2.x's zero_grad() sets
  // them to none) is copied in and gets the view, which will hold the average, back.
  if (cuda_buckets_) {
    cuda_buckets_->mark_ready(*comm_, index, g);
    g = cuda_buckets_->slots[index];
    return;
  }
  if (g.data_ptr() != buckets_->slot(index)) {
    ::torch::NoGradGuard ng;
    auto view = host_slot_view(buckets_->slot(index), p);
    view.copy_(g);
    g = view;
  }
  buckets_->mark_ready(index, f32_view(g));
}

void DataParallel::end_backward(int64_t step) {
  if (reduce_scattering()) {
    if (armed_) sharded_->finish_gradients();
    armed_ = false;
    begun_ = false;
    return;
  }
  if (armed_) {
    // Parameters whose gradient never arrived (unused this step) still need a
    // buffer so every rank averages the same thing.
    for (auto& p : params_)
      if (!p.grad().defined()) p.mutable_grad() = ::torch::zeros_like(p);
    for (size_t i = 0; i < params_.size(); ++i) on_grad_ready(i, false);
    if (cuda_buckets_)
      cuda_buckets_->finish();
    else
      buckets_->finish();
    armed_ = false;
    begun_ = false;
  }
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
  if (cuda_buckets_) {
    s.wait_seconds += cuda_buckets_->stats.wait_seconds;
    s.allreduces += cuda_buckets_->stats.allreduces;
    s.bytes_on_wire += cuda_buckets_->stats.bytes_on_wire;
  }
  if (buckets_) {
    s.wait_seconds += buckets_->stats().wait_seconds;
    s.allreduces += buckets_->stats().allreduces;
    s.bytes_on_wire += buckets_->stats().bytes_on_wire;
  }
  return s;
}

void DataParallel::reset_stats() {
  extra_ = {};
  if (sharded_) sharded_->reset_stats();
  if (buckets_) buckets_->reset_stats();
  if (cuda_buckets_) cuda_buckets_->stats = {};
}

}  // namespace dtrain::fleet
