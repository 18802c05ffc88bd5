#include "dtrain/fleet/sharding.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/fleet/optimizers.h"
#include "tensor_buffer.h"

namespace dtrain::fleet {

namespace {

using detail::device_view;

std::string state_key(const ::torch::Tensor& t) { return c10::guts::to_string(t.unsafeGetTensorImpl()); }

// p's elements [from, from + len) in logical order, clipped to its size.
int64_t clipped(int64_t numel, int64_t from, int64_t len) { return std::max<int64_t>(0, std::min(len, numel - from)); }

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
  return ::torch::from_blob(p.storage().data(), {p.numel()}, p.options().requires_grad(false));
}

}  // namespace

ShardedParameters::ShardedParameters(std::shared_ptr<::torch::nn::Module> model, std::vector<::torch::Tensor> params,
                                     std::vector<std::string> names, std::shared_ptr<Communicator> comm,
                                     const StrategyOptions& options)
    : model_(std::move(model)),
      comm_(std::move(comm)),
      stage_(options.sharding_stage),
      bucket_bytes_(options.fuse_all_reduce_ops ? options.bucket_bytes() : 0) {
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
  // Buckets as DataParallel groups gradients: reverse registration order, up to bucket_bytes whole.
  if (stage_ >= 2) {
    size_t bytes = 0;
    for (size_t k = params_.size(); k-- > 0;) {
      const size_t b = static_cast<size_t>(params_[k].numel) * sizeof(float);
      if (buckets_.empty() || (!buckets_.back().members.empty() && bytes + b > bucket_bytes_)) {
        buckets_.emplace_back();
        bytes = 0;
      }
      auto& bk = buckets_.back();
      params_[k].bucket = buckets_.size() - 1;
      params_[k].bucket_offset = bk.block;
      bk.members.push_back(k);
      bk.block += params_[k].per;
      bk.pending = bk.members.size();
      bytes += b;
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

void ShardedParameters::launch_ready_locked() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    auto& b = buckets_[next_launch_++];
    if (!b.send.defined()) b.send = ::torch::zeros({b.block * world_}, shard_flat_.options());
    b.recv = ::torch::empty({b.block}, shard_flat_.options());
    stats_.allreduces++;
    stats_.bytes_on_wire += b.block * world_ * static_cast<int64_t>(sizeof(float));
    if (comm_)
      b.work = comm_->reduce_scatter(device_view(b.send), device_view(b.recv), ReduceOp::Avg);
    else
      b.recv.copy_(b.send);
  }
}

void ShardedParameters::begin_step() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& b : buckets_) b.pending = b.members.size();
  for (auto& q : params_) q.ready = false;
  next_launch_ = 0;
}

void ShardedParameters::on_grad_ready(size_t i) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& q = params_[i];
  if (q.ready) return;
  q.ready = true;
  auto& b = buckets_[q.bucket];
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
  --b.pending;
  launch_ready_locked();
}

void ShardedParameters::finish_gradients() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (!params_[i].ready) on_grad_ready(i);
  std::lock_guard<std::mutex> lk(mu_);
  auto t0 = std::chrono::steady_clock::now();
  for (auto& b : buckets_)
    if (b.work) {
      b.work->wait();
      b.work.reset();
    }
  stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::torch::NoGradGuard ng;
  for (auto& b : buckets_) {
    for (size_t i : b.members) {
      auto& q = params_[i];
      auto& g = q.shard.mutable_grad();
      g.copy_(b.recv.narrow(0, q.bucket_offset, g.numel()));
      q.ready = false;
    }
    b.send = ::torch::Tensor();
    b.recv = ::torch::Tensor();
  }
  next_launch_ = 0;
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

// ---- optimizer state and sharded checkpoints ------------------------------------

namespace {

std::string state_kind(const ::torch::optim::OptimizerParamState& s) {
  if (dynamic_cast<const ::torch::optim::SGDParamState*>(&s)) return "sgd";
  if (dynamic_cast<const ::torch::optim::AdamParamState*>(&s)) return "adam";
  if (dynamic_cast<const ::torch::optim::AdamWParamState*>(&s)) return "adamw";
  if (dynamic_cast<const ::torch::optim::AdagradParamState*>(&s)) return "adagrad";
  if (dynamic_cast<const ::torch::optim::RMSpropParamState*>(&s)) return "rmsprop";
  if (dynamic_cast<const LambParamState*>(&s)) return "lamb";
  if (dynamic_cast<const LarsParamState*>(&s)) return "lars";
  throw NotSupported(
      "sharded checkpoints know the state of SGD, Adam, AdamW, Adagrad, RMSprop, LAMB and LARS; this optimizer's "
      "state is another kind");
}

std::unique_ptr<::torch::optim::OptimizerParamState> make_state(const std::string& kind) {
  if (kind == "sgd") return std::make_unique<::torch::optim::SGDParamState>();
  if (kind == "adam") return std::make_unique<::torch::optim::AdamParamState>();
  if (kind == "adamw") return std::make_unique<::torch::optim::AdamWParamState>();
  if (kind == "adagrad") return std::make_unique<::torch::optim::AdagradParamState>();
  if (kind == "rmsprop") return std::make_unique<::torch::optim::RMSpropParamState>();
  if (kind == "lamb") return std::make_unique<LambParamState>();
  if (kind == "lars") return std::make_unique<LarsParamState>();
  throw InvalidUsage("sharded checkpoint: unknown optimizer state kind '" + kind + "'");
}

// An optimizer state's entries by name, through its own serialize().
std::vector<std::pair<std::string, c10::IValue>> state_entries(const ::torch::optim::OptimizerParamState& s) {
  ::torch::serialize::OutputArchive out;
  s.serialize(out);
  std::ostringstream os;
  out.save_to(os);
  std::istringstream is(os.str());
  ::torch::serialize::InputArchive in;
  in.load_from(is);
  std::vector<std::pair<std::string, c10::IValue>> entries;
  for (const auto& k : in.keys()) {
    ::torch::Tensor t;
    if (in.try_read(k, t, /*is_buffer=*/true) || in.try_read(k, t)) {
      entries.emplace_back(k, t);
      continue;
    }
    c10::IValue v;
    if (in.try_read(k, v)) entries.emplace_back(k, v);
  }
  return entries;
}

void set_state(::torch::optim::Optimizer& opt, const ::torch::Tensor& param, const std::string& kind,
               const std::vector<std::pair<std::string, c10::IValue>>& entries) {
  ::torch::serialize::OutputArchive out;
  for (const auto& [k, v] : entries) {
    if (v.isTensor())
      out.write(k, v.toTensor(), /*is_buffer=*/true);
    else
      out.write(k, v);
  }
  std::ostringstream os;
  out.save_to(os);
  std::istringstream is(os.str());
  ::torch::serialize::InputArchive in;
  in.load_from(is);
  auto st = make_state(kind);
  st->serialize(in);
  opt.state()[state_key(param)] = std::move(st);
}

int64_t read_int(::torch::serialize::InputArchive& ar, const std::string& key) {
  c10::IValue v;
  if (!ar.try_read(key, v)) throw InvalidUsage("sharded checkpoint: entry '" + key + "' is missing");
  return v.toInt();
}

std::string read_string(::torch::serialize::InputArchive& ar, const std::string& key) {
  c10::IValue v;
  if (!ar.try_read(key, v)) return "";
  return v.toStringRef();
}

std::string key_of(size_t i, const char* what) { return "shard/" + std::to_string(i) + "/" + what; }

// One parameter's whole value and optimizer state, put together from the slices of N archives.
struct Whole {
  ::torch::Tensor value;
  std::string kind;  // "" without optimizer state
  std::vector<std::pair<std::string, c10::IValue>> state;
};

Whole consolidate(std::vector<::torch::serialize::InputArchive>& ars, size_t i, int64_t numel) {
  Whole w;
  std::vector<::torch::Tensor> slices;
  std::vector<std::vector<std::pair<std::string, c10::IValue>>> states;
  for (auto& ar : ars) {
    ::torch::Tensor s;
    ar.read(key_of(i, "value"), s);
    slices.push_back(s);
    std::string kind = read_string(ar, key_of(i, "kind"));
    if (!kind.empty()) {
      w.kind = kind;
      ::torch::serialize::InputArchive st;
      ar.read(key_of(i, "state"), st);
      std::vector<std::pair<std::string, c10::IValue>> e;
      for (const auto& k : st.keys()) {
        ::torch::Tensor t;
        if (st.try_read(k, t, true) || st.try_read(k, t)) {
          e.emplace_back(k, t);
          continue;
        }
        c10::IValue v;
        if (st.try_read(k, v)) e.emplace_back(k, v);
      }
      states.push_back(std::move(e));
    }
  }
  w.value = ::torch::cat(slices).narrow(0, 0, numel);
  if (!w.kind.empty()) {
    if (states.size() != ars.size())
      throw InvalidUsage("sharded checkpoint: parameter " + std::to_string(i) +
                         " has optimizer state in some ranks' files only");
    for (size_t e = 0; e < states[0].size(); ++e) {
      const auto& [k, v] = states[0][e];
      // Rank 0's slice is the longest: ranks after it may hold fewer elements (stages 1-2) or padding (stage 3).
      if (v.isTensor() && v.toTensor().dim() == 1 && v.toTensor().numel() == slices[0].numel()) {
        std::vector<::torch::Tensor> parts;
        for (auto& s : states) parts.push_back(s[e].second.toTensor());
        w.state.emplace_back(k, ::torch::cat(parts).narrow(0, 0, numel));
      } else {
        w.state.emplace_back(k, v);  // a step count or a scalar: the same on every rank
      }
    }
  }
  return w;
}

// Checks the archives are the ranks 0..N-1 of one save and describe `count` parameters.
int64_t check_archives(std::vector<::torch::serialize::InputArchive>& ars, size_t count) {
  if (ars.empty()) throw InvalidUsage("sharded checkpoint: no files");
  const int64_t n = read_int(ars[0], "shard/world");
  if (static_cast<int64_t>(ars.size()) != n)
    throw InvalidUsage("sharded checkpoint: saved by " + std::to_string(n) + " ranks, but " +
                       std::to_string(ars.size()) + " files were given");
  for (size_t r = 0; r < ars.size(); ++r) {
    if (read_int(ars[r], "shard/rank") != static_cast<int64_t>(r) || read_int(ars[r], "shard/world") != n)
      throw InvalidUsage("sharded checkpoint: file " + std::to_string(r) + " is not rank " + std::to_string(r) +
                         " of " + std::to_string(n));
    if (read_int(ars[r], "shard/count") != static_cast<int64_t>(count))
      throw InvalidUsage("sharded checkpoint: it holds " + std::to_string(read_int(ars[r], "shard/count")) +
                         " parameters, this model has " + std::to_string(count));
  }
  return n;
}

void check_param(std::vector<::torch::serialize::InputArchive>& ars, size_t i, const std::string& name, int64_t numel) {
  const std::string saved = read_string(ars[0], key_of(i, "name"));
  const int64_t saved_numel = read_int(ars[0], key_of(i, "numel"));
  if (saved != name || saved_numel != numel)
    throw InvalidUsage("sharded checkpoint: parameter " + std::to_string(i) + " is '" + saved + "' (" +
                       std::to_string(saved_numel) + " elements) in the checkpoint, '" + name + "' (" +
                       std::to_string(numel) + ") in this model");
}

}  // namespace

void save_shard(::torch::serialize::OutputArchive& ar, const ShardedParameters& sp, ::torch::optim::Optimizer& opt) {
  ar.write("shard/world", c10::IValue(static_cast<int64_t>(sp.world())));
  ar.write("shard/rank", c10::IValue(static_cast<int64_t>(sp.rank())));
  ar.write("shard/count", c10::IValue(static_cast<int64_t>(sp.size())));
  for (size_t i = 0; i < sp.size(); ++i) {
    ar.write(key_of(i, "name"), c10::IValue(sp.name(i)));
    ar.write(key_of(i, "numel"), c10::IValue(sp.numel(i)));
    ar.write(key_of(i, "shape"), c10::IValue(sp.parameter(i).sizes().vec()));
    ar.write(key_of(i, "value"), sp.shard(i).detach().cpu(), /*is_buffer=*/true);
    auto it = opt.state().find(state_key(sp.shard(i)));
    if (it == opt.state().end()) continue;
    ar.write(key_of(i, "kind"), c10::IValue(state_kind(*it->second)));
    ::torch::serialize::OutputArchive st;
    it->second->serialize(st);
    ar.write(key_of(i, "state"), st);
  }
}

void load_shards(std::vector<::torch::serialize::InputArchive>& ars, ShardedParameters& sp,
                 ::torch::optim::Optimizer& opt) {
  check_archives(ars, sp.size());
  ::torch::NoGradGuard ng;
  for (size_t i = 0; i < sp.size(); ++i) {
    check_param(ars, i, sp.name(i), sp.numel(i));
    Whole w = consolidate(ars, i, sp.numel(i));
    auto shard = sp.shard(i);
    const int64_t per = sp.slice_numel(i), from = sp.rank() * per;
    const int64_t len = std::min(clipped(sp.numel(i), from, per), shard.numel());
    auto slice = [&](const ::torch::Tensor& whole) {
      auto s = ::torch::zeros({shard.numel()}, whole.options());
      if (len > 0) s.narrow(0, 0, len).copy_(whole.narrow(0, from, len));
      return s;
    };
    shard.copy_(slice(w.value).to(shard.device()));
    if (w.kind.empty()) {
      opt.state().erase(state_key(shard));
      continue;
    }
    for (auto& [k, v] : w.state)
      if (v.isTensor() && v.toTensor().dim() == 1 && v.toTensor().numel() == sp.numel(i))
        v = slice(v.toTensor()).to(shard.device());
    set_state(opt, shard, w.kind, w.state);
  }
  sp.after_step();
}

void load_shards_unsharded(std::vector<::torch::serialize::InputArchive>& ars, ::torch::nn::Module& model,
                           ::torch::optim::Optimizer& opt) {
  std::vector<std::pair<std::string, ::torch::Tensor>> params;
  for (auto& kv : model.named_parameters())
    if (kv.value().requires_grad()) params.emplace_back(kv.key(), kv.value());
  check_archives(ars, params.size());
  ::torch::NoGradGuard ng;
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i].second;
    check_param(ars, i, params[i].first, p.numel());
    Whole w = consolidate(ars, i, p.numel());
    p.copy_(w.value.view(p.sizes()));
    if (w.kind.empty()) {
      opt.state().erase(state_key(p));
      continue;
    }
    for (auto& [k, v] : w.state)
      if (v.isTensor() && v.toTensor().dim() == 1 && v.toTensor().numel() == p.numel())
        v = v.toTensor().view(p.sizes()).to(p.device());
    set_state(opt, p, w.kind, w.state);
  }
}

std::vector<std::pair<std::string, ::torch::Tensor>> whole_parameters(
    std::vector<::torch::serialize::InputArchive>& ars) {
  if (ars.empty()) throw InvalidUsage("sharded checkpoint: no files");
  const int64_t count = read_int(ars[0], "shard/count");
  check_archives(ars, static_cast<size_t>(count));
  std::vector<std::pair<std::string, ::torch::Tensor>> out;
  for (size_t i = 0; i < static_cast<size_t>(count); ++i) {
    auto value = consolidate(ars, i, read_int(ars[0], key_of(i, "numel"))).value;
    c10::IValue shape;
    if (ars[0].try_read(key_of(i, "shape"), shape)) value = value.view(shape.toIntVector());
    out.emplace_back(read_string(ars[0], key_of(i, "name")), value);
  }
  return out;
}

int64_t optimizer_state_bytes(::torch::optim::Optimizer& opt) {
  int64_t bytes = 0;
  for (auto& g : opt.param_groups())
    for (auto& p : g.params()) {
      auto it = opt.state().find(state_key(p));
      if (it == opt.state().end()) continue;
      for (auto& [k, v] : state_entries(*it->second))
        if (v.isTensor()) bytes += v.toTensor().numel() * static_cast<int64_t>(v.toTensor().element_size());
    }
  return bytes;
}

}  // namespace dtrain::fleet
