#include "dtrain/fleet/sharding.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/fleet/optimizers.h"
#include "gradient_sync.h"
#include "tensor_buffer.h"

namespace dtrain::fleet {

namespace {

using detail::clipped;
using detail::device_view;

void free_storage(const ::torch::Tensor& p) {
  auto* st = p.storage().unsafeGetStorageImpl();
  st->set_data_ptr_noswap(at::DataPtr(nullptr, p.device()));
  st->set_nbytes(0);
}

void allocate_storage(const ::torch::Tensor& p) {
  auto* st = p.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(p.numel()) * p.element_size();
  st->set_data_ptr_noswap(st->allocator()->allocate(bytes));
  st->set_nbytes(bytes);
}

// p's data as a flat tensor that shares its storage but not its version
// counter: writing it does not invalidate tensors autograd saved.
::torch::Tensor raw_flat(const ::torch::Tensor& p) {
  return ::torch::from_blob(const_cast<void*>(p.storage().data()), {p.numel()}, p.options().requires_grad(false));
}

}  // namespace

ShardedParameters::ShardedParameters(std::shared_ptr<::torch::nn::Module> model, std::vector<::torch::Tensor> params,
                                     std::vector<std::string> names, std::shared_ptr<Communicator> comm,
                                     const StrategyOptions& options)
    : model_(std::move(model)),
      comm_(std::move(comm)),
      stage_(options.sharding_stage),
      bucket_bytes_(options.gradient_bucket_bytes()) {
  if (stage_ < 1 || stage_ > 3) throw InvalidUsage("sharding: stage must be 1, 2 or 3, got " + std::to_string(stage_));
  if (comm_ && comm_->size() > 1) {
    world_ = comm_->size();
    rank_ = comm_->rank();
  } else {
    comm_.reset();
  }
  for (auto& m : model_->modules(/*include_self=*/true)) modules_.insert(m.get());
  params_.resize(params.size());
  int64_t offset = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    auto& q = params_[i];
    q.p = params[i];
    q.name = names[i];
    q.numel = q.p.numel();
    q.per = (q.numel + world_ - 1) / world_;
    q.len = clipped(q.numel, rank_ * q.per, q.per);
    // Stages 1 and 2 keep whole parameters: a contiguous one's shard is a view of its own slice.
    q.view = stage_ < 3 && q.p.is_contiguous();
    if (!q.view) {
      q.shard_offset = offset;
      offset += q.per;
    }
    index_[q.p.unsafeGetTensorImpl()] = i;
    if (stage_ == 3 && (!q.p.is_contiguous() || q.p.storage_offset() != 0 ||
                        q.p.storage().nbytes() != static_cast<size_t>(q.numel) * q.p.element_size()))
      throw NotSupported("sharding stage 3 frees each parameter's own storage; '" + q.name +
                         "' is not a contiguous tensor that owns its storage (channels-last or tied weights); use "
                         "stage 2, or a contiguous parameter");
  }
  auto opts =
      params.empty() ? ::torch::TensorOptions().dtype(::torch::kFloat32) : params[0].options().requires_grad(false);
  shard_flat_ = ::torch::zeros({offset}, opts);
  ::torch::NoGradGuard ng;
  for (auto& q : params_) {
    const int64_t from = std::min(rank_ * q.per, q.numel);
    if (q.view) {
      q.shard = q.p.detach().view({-1}).narrow(0, from, q.len);
    } else {
      q.shard = shard_flat_.narrow(0, q.shard_offset, q.per);
      if (q.len > 0) q.shard.narrow(0, 0, q.len).copy_(q.p.detach().reshape({-1}).narrow(0, from, q.len));
    }
    // Not a view of one flat tensor: Optimizer::zero_grad detaches gradients in place.
    q.shard.mutable_grad() = ::torch::zeros({q.shard.numel()}, opts);
  }
  // The reduce-scatter buckets group whole gradients by the core's rule, as DataParallel's do.
  if (stage_ >= 2) {
    std::vector<size_t> bytes;
    for (auto& q : params_) bytes.push_back(static_cast<size_t>(q.numel) * sizeof(float));
    bucketer_.emplace(bytes, bucket_bytes_);
    buckets_.resize(bucketer_->num_buckets());
    for (size_t b = 0; b < buckets_.size(); ++b)
      for (size_t i : bucketer_->members(b)) {
        params_[i].bucket_offset = buckets_[b].block;
        buckets_[b].block += params_[i].per;
      }
  }
  if (stage_ == 3) add_block_observer(this);
}

ShardedParameters::~ShardedParameters() {
  if (stage_ == 3) remove_block_observer(this);
  for (auto& b : buckets_)
    if (b.work) {
      try {
        b.work->wait();
      } catch (...) {
      }
    }
  // The model outlives this object: give it back whole parameters.
  if (stage_ == 3) {
    try {
      ::torch::NoGradGuard ng;
      std::vector<size_t> released;
      for (size_t i = 0; i < params_.size(); ++i)
        if (params_[i].released) released.push_back(i);
      if (!released.empty() && (!comm_ || !comm_->is_poisoned())) gather(released);
    } catch (...) {
    }
  }
}

int64_t ShardedParameters::index_of(const ::torch::Tensor& t) const {
  auto it = index_.find(t.unsafeGetTensorImpl());
  return it == index_.end() ? -1 : static_cast<int64_t>(it->second);
}

::torch::Tensor ShardedParameters::allgather(const std::vector<size_t>& indices, int64_t* block) {
  int64_t n = 0;
  for (size_t i : indices) n += params_[i].per;
  *block = n;
  auto send = ::torch::zeros({n}, shard_flat_.options());
  int64_t off = 0;
  for (size_t i : indices) {
    send.narrow(0, off, params_[i].shard.numel()).copy_(params_[i].shard);
    off += params_[i].per;
  }
  if (!comm_) return send;
  auto recv = ::torch::empty({n * world_}, shard_flat_.options());
  auto t0 = std::chrono::steady_clock::now();
  comm_->allgather(device_view(send), device_view(recv), CallOptions::wait_now());
  stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats_.allreduces++;
  stats_.bytes_on_wire += n * static_cast<int64_t>(sizeof(float));
  return recv;
}

// Writes the gathered parameters: into their storage without touching their
// version counters when released (autograd's saved tensors share it), by a
// plain copy otherwise.
void ShardedParameters::gather(const std::vector<size_t>& indices) {
  if (indices.empty()) return;
  ::torch::NoGradGuard ng;
  int64_t block = 0;
  auto recv = allgather(indices, &block);
  int64_t off = 0;
  for (size_t i : indices) {
    auto& q = params_[i];
    ::torch::Tensor dst;
    const bool raw = q.released;
    if (raw) {
      allocate_storage(q.p);
      q.released = false;
      dst = raw_flat(q.p);
    } else {
      dst = ::torch::empty({q.numel}, shard_flat_.options());
    }
    for (int r = 0; r < world_; ++r) {
      const int64_t len = clipped(q.numel, r * q.per, q.per);
      if (len > 0) dst.narrow(0, r * q.per, len).copy_(recv.narrow(0, r * block + off, len));
    }
    if (!raw) q.p.detach().copy_(dst.view(q.p.sizes()));
    off += q.per;
  }
}

void ShardedParameters::refresh(const std::vector<size_t>& indices) {
  // In bucket-sized groups, so the gathered copy in flight stays small.
  std::vector<size_t> group;
  size_t bytes = 0;
  for (size_t i : indices) {
    group.push_back(i);
    bytes += static_cast<size_t>(params_[i].numel) * sizeof(float);
    if (bytes >= std::max<size_t>(bucket_bytes_, 1)) {
      gather(group);
      group.clear();
      bytes = 0;
    }
  }
  gather(group);
}

void ShardedParameters::release(size_t i) {
  auto& q = params_[i];
  if (stage_ != 3 || !q.in_block || q.released || q.refs > 0) return;
  free_storage(q.p);
  q.released = true;
}

const std::vector<size_t>& ShardedParameters::block_params(const ::torch::nn::Module& block) {
  auto it = blocks_.find(&block);
  if (it != blocks_.end()) return it->second;
  std::vector<size_t> idx;
  for (auto& t : block.parameters(/*recurse=*/true)) {
    int64_t i = index_of(t);
    if (i < 0) continue;
    idx.push_back(static_cast<size_t>(i));
    params_[static_cast<size_t>(i)].in_block = true;
  }
  return blocks_.emplace(&block, std::move(idx)).first->second;
}

bool ShardedParameters::owns(const ::torch::nn::Module& block) const { return modules_.count(&block) > 0; }

void ShardedParameters::before_forward(::torch::nn::Module& block) {
  const auto& idx = block_params(block);
  std::vector<size_t> need;
  for (size_t i : idx)
    if (params_[i].released) need.push_back(i);
  gather(need);
  for (size_t i : idx) ++params_[i].refs;
}

void ShardedParameters::after_forward(::torch::nn::Module& block) {
  for (size_t i : block_params(block)) {
    if (params_[i].refs > 0) --params_[i].refs;
    release(i);
  }
}

void ShardedParameters::before_backward(::torch::nn::Module& block) { before_forward(block); }

void ShardedParameters::take_full_gradients() {
  ::torch::NoGradGuard ng;
  for (auto& q : params_) {
    auto g = q.shard.mutable_grad();
    g.zero_();
    if (!q.p.grad().defined()) continue;
    const int64_t len = clipped(q.numel, rank_ * q.per, q.per);
    if (len > 0) g.narrow(0, 0, len).copy_(q.p.grad().reshape({-1}).narrow(0, rank_ * q.per, len));
    q.p.mutable_grad().zero_();
  }
}

void ShardedParameters::launch(size_t bucket) {
  auto& b = buckets_[bucket];
  if (!b.send.defined()) b.send = ::torch::zeros({b.block * world_}, shard_flat_.options());
  b.recv = ::torch::empty({b.block}, shard_flat_.options());
  stats_.allreduces++;
  stats_.bytes_on_wire += b.block * world_ * static_cast<int64_t>(sizeof(float));
  if (comm_)
    b.work = comm_->reduce_scatter(device_view(b.send), device_view(b.recv), ReduceOp::Avg);
  else
    b.recv.copy_(b.send);
}

void ShardedParameters::begin_step() {
  std::lock_guard<std::mutex> lk(mu_);
  if (bucketer_) bucketer_->begin();
}

void ShardedParameters::on_grad_ready(size_t i) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& q = params_[i];
  if (bucketer_->ready(i)) return;
  auto& b = buckets_[bucketer_->bucket_of(i)];
  ::torch::NoGradGuard ng;
  if (!b.send.defined()) b.send = ::torch::zeros({b.block * world_}, shard_flat_.options());
  auto& g = q.p.mutable_grad();
  if (g.defined()) {
    auto flat = g.reshape({-1});
    for (int r = 0; r < world_; ++r) {
      const int64_t len = clipped(q.numel, r * q.per, q.per);
      if (len > 0) b.send.narrow(0, r * b.block + q.bucket_offset, len).copy_(flat.narrow(0, r * q.per, len));
    }
    g = ::torch::Tensor();
  }
  if (q.refs > 0) --q.refs;
  release(i);
  bucketer_->mark(i, *this);
}

void ShardedParameters::finish_gradients() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (!bucketer_->ready(i)) on_grad_ready(i);
  std::lock_guard<std::mutex> lk(mu_);
  wait_buckets(buckets_, stats_);
  ::torch::NoGradGuard ng;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    auto& b = buckets_[k];
    for (size_t i : bucketer_->members(k)) {
      auto& q = params_[i];
      auto& g = q.shard.mutable_grad();
      g.copy_(b.recv.narrow(0, q.bucket_offset, g.numel()));
    }
    b.send = ::torch::Tensor();
    b.recv = ::torch::Tensor();
  }
  bucketer_->begin();
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].refs = 0;
    release(i);
  }
}

void ShardedParameters::after_step() {
  std::vector<size_t> whole;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!params_[i].released) whole.push_back(i);
  refresh(whole);
}

void ShardedParameters::gather_all() {
  std::vector<size_t> released;
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].released) released.push_back(i);
  refresh(released);
  for (size_t i : released) ++params_[i].refs;
}

void ShardedParameters::release_all() {
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].refs = 0;
    release(i);
  }
}

void ShardedParameters::allreduce_sum(std::vector<double>& v) {
  if (!comm_ || v.empty()) return;
  comm_->allreduce(Buffer::of(v.data(), v.size()), ReduceOp::Sum, CallOptions::wait_now());
}

bool ShardedParameters::any(bool flag) {
  std::vector<double> v{flag ? 1.0 : 0.0};
  allreduce_sum(v);
  return v[0] > 0;
}

ShardedParameters::Memory ShardedParameters::memory() const {
  Memory m;
  m.parameter_bytes = shard_flat_.numel() * static_cast<int64_t>(sizeof(float));
  for (auto& q : params_) {
    if (q.shard.grad().defined()) m.gradient_bytes += q.shard.grad().numel() * static_cast<int64_t>(sizeof(float));
    m.parameter_bytes += static_cast<int64_t>(q.p.storage().nbytes());
    if (q.p.grad().defined()) m.gradient_bytes += q.p.grad().numel() * static_cast<int64_t>(sizeof(float));
  }
  for (auto& b : buckets_) {
    if (b.send.defined()) m.gradient_bytes += b.send.numel() * static_cast<int64_t>(sizeof(float));
    if (b.recv.defined()) m.gradient_bytes += b.recv.numel() * static_cast<int64_t>(sizeof(float));
  }
  return m;
}

}  // namespace dtrain::fleet

namespace dtrain::fleet {

namespace {

// ZeRO stages 2 and 3 as DataParallel's gradient reduction: each gradient is
// reduce-scattered into this rank's shard, every micro-step.
class ShardedGradients : public GradientSync {
 public:
  explicit ShardedGradients(ShardedParameters& sharded) : sharded_(sharded) {}
  bool syncs_at(const Strategy&, int64_t) const override { return true; }
  void begin() override { sharded_.begin_step(); }
  void ready(size_t i) override { sharded_.on_grad_ready(i); }
  void finish() override { sharded_.finish_gradients(); }
  bool into_shards() const override { return true; }
  // Counted by the ShardedParameters, whose stats DataParallel adds whatever the stage.
  SyncStats stats() const override { return {}; }
  void reset_stats() override {}

 private:
  ShardedParameters& sharded_;
};

}  // namespace

std::unique_ptr<GradientSync> sharded_gradients(ShardedParameters& sharded) {
  return std::make_unique<ShardedGradients>(sharded);
}

}  // namespace dtrain::fleet
