#include "dtrain/torch/data_parallel.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include "dtrain/communicator.h"
#include "dtrain/error.h"

namespace dtrain::torch {

namespace {

Buffer f32_view(const ::torch::Tensor& t) {
  return Buffer(t.data_ptr<float>(), static_cast<size_t>(t.numel()), DType::F32);
}

}  // namespace

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
  for (auto& kv : model_->named_parameters()) {
    auto& p = kv.value();
    if (p.requires_grad() && (p.scalar_type() != ::torch::kFloat32 || !p.is_contiguous() || !p.device().is_cpu()))
      throw NotSupported("data parallelism needs contiguous float32 CPU parameters; '" + kv.key() + "' is " +
                         std::string(c10::toString(p.scalar_type())) + " on " + p.device().str());
  }
  if (world_size() <= 1) return;

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

  std::vector<size_t> counts;
  for (auto& p : params_) counts.push_back(static_cast<size_t>(p.numel()));
  buckets_ = std::make_unique<GradientBuckets>(comm_, counts, options);
  // The gradients live in their buckets (c10d's gradient_as_bucket_view):
  // backward accumulates into the bucket and the all-reduce averages it in
  // place, with no copy in or out. zero_grad() zeroes in place and keeps the
  // view; a gradient replaced by another tensor is copied as before.
  {
    ::torch::NoGradGuard ng;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      auto view = ::torch::from_blob(buckets_->slot(i), p.sizes(), p.options().requires_grad(false));
      if (p.grad().defined())
        view.copy_(p.grad());
      else
        view.zero_();
      p.mutable_grad() = view;
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = ::torch::autograd::impl::grad_accumulator(params_[i]);
    acc->add_post_hook(std::make_unique<Hook>(this, i));
    accumulators_.push_back(std::move(acc));
  }
}

DataParallel::~DataParallel() {
  if (!buckets_) return;
  // The bucket memory goes with this object: gradients still in it get their own.
  ::torch::NoGradGuard ng;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    if (p.grad().defined() && p.grad().data_ptr() == buckets_->slot(i)) p.mutable_grad() = p.grad().clone();
  }
}

int DataParallel::world_size() const { return comm_ ? comm_->size() : 1; }

void DataParallel::begin_step(int64_t step) {
  armed_ = buckets_ && strategy_.sync_gradients_at(step);
  if (armed_ && !begun_) {
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
  auto& p = params_[index];
  auto& g = p.mutable_grad();
  if (!g.defined()) return;
  if (!g.is_contiguous()) g = g.contiguous();
  buckets_->mark_ready(index, f32_view(g));
}

void DataParallel::end_backward(int64_t step) {
  if (armed_) {
    // Parameters whose gradient never arrived (unused this step) still need a
    // buffer so every rank averages the same thing.
    for (auto& p : params_)
      if (!p.grad().defined()) p.mutable_grad() = ::torch::zeros_like(p);
    for (size_t i = 0; i < params_.size(); ++i) on_grad_ready(i, false);
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
}

void DataParallel::after_optimizer_step(int64_t step) {
  if (world_size() > 1 && strategy_.average_parameters_at(step)) {
    ::torch::NoGradGuard ng;
    std::vector<Buffer> bufs;
    for (auto& p : params_) bufs.push_back(f32_view(p));
    ::dtrain::average_buffers(*comm_, bufs, strategy_.options().bucket_bytes(), &extra_);
  }
}

void DataParallel::average_buffers() {
  if (world_size() <= 1) return;
  ::torch::NoGradGuard ng;
  std::vector<Buffer> bufs;
  for (auto& b : model_->buffers())
    if (b.scalar_type() == ::torch::kFloat32) bufs.push_back(f32_view(b));
  ::dtrain::average_buffers(*comm_, bufs, strategy_.options().bucket_bytes(), &extra_);
}

void DataParallel::allreduce_sum(std::vector<double>& values) {
  if (world_size() <= 1 || values.empty()) return;
  comm_->allreduce(Buffer::of(values.data(), values.size()), ReduceOp::Sum)->wait();
}

SyncStats DataParallel::stats() const {
  SyncStats s = extra_;
  if (buckets_) {
    s.wait_seconds += buckets_->stats().wait_seconds;
    s.allreduces += buckets_->stats().allreduces;
    s.bytes_on_wire += buckets_->stats().bytes_on_wire;
  }
  return s;
}

void DataParallel::reset_stats() {
  extra_ = {};
  if (buckets_) buckets_->reset_stats();
}

}  // namespace dtrain::torch
