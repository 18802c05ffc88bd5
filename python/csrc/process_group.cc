// Python.h first, as Python asks (it sets feature macros the C library reads).
#include <Python.h>

#include "process_group.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"

namespace dtrain::python {

namespace {

DType wire_dtype(at::ScalarType st, const std::string& where) {
  switch (st) {
    case at::kFloat: return DType::F32;
    case at::kDouble: return DType::F64;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kChar: return DType::I8;
    case at::kByte:
    case at::kBool: return DType::U8;
    case at::kInt: return DType::I32;
    case at::kLong: return DType::I64;
    default:
      throw NotSupported(where + ": tensors of dtype " + std::string(c10::toString(st)) +
                         " (the plugins carry float32/64, float16, bfloat16, int8, uint8, int32, int64, bool and "
                         "complex as pairs of floats)");
  }
}

// The tensor as the core sees it: complex as pairs of reals, bool as bytes.
at::Tensor wire_view(const at::Tensor& t) {
  if (t.is_complex()) return at::view_as_real(t);
  if (t.scalar_type() == at::kBool) return t.view(at::kByte);
  return t;
}

Buffer buffer_of(const at::Tensor& t, const std::string& where) {
  at::Tensor w = wire_view(t);
  TORCH_INTERNAL_ASSERT(w.is_contiguous());
  Device dev = w.is_cuda() ? Device::cuda(w.get_device()) : Device::cpu();
  return Buffer(w.data_ptr(), static_cast<size_t>(w.numel()), wire_dtype(w.scalar_type(), where), dev);
}

ReduceOp reduce_op(const c10d::ReduceOp& op, const at::Tensor& t, const std::string& where) {
  const bool boolean = t.scalar_type() == at::kBool;
  if (t.is_complex() && op != c10d::ReduceOp::SUM && op != c10d::ReduceOp::AVG)
    throw NotSupported(where + ": complex tensors reduce only with SUM or AVG");
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM: return boolean ? ReduceOp::Max : ReduceOp::Sum;
    case c10d::ReduceOp::AVG:
      if (!t.is_floating_point() && !t.is_complex()) break;  // as NCCL's: integers would truncate
      return ReduceOp::Avg;
    case c10d::ReduceOp::PRODUCT: return boolean ? ReduceOp::Min : ReduceOp::Prod;
    case c10d::ReduceOp::MIN: return ReduceOp::Min;
    case c10d::ReduceOp::MAX: return ReduceOp::Max;
    case c10d::ReduceOp::BOR:
      if (boolean) return ReduceOp::Max;
      break;
    case c10d::ReduceOp::BAND:
      if (boolean) return ReduceOp::Min;
      break;
    default: break;
  }
  throw NotSupported(where + ": ReduceOp " + std::to_string(static_cast<int>(op.op_)) + " on " +
                     std::string(c10::toString(t.scalar_type())) +
                     " tensors (SUM, PRODUCT, MIN, MAX; AVG on floating types; BAND and BOR on bool)");
}

// A tensor the core writes into: itself when contiguous, else a contiguous
// copy that copy_back() writes into it.
struct Staged {
  at::Tensor user, dense;
  explicit Staged(const at::Tensor& t) : user(t), dense(t.is_contiguous() ? t : t.contiguous()) {}
  void copy_back() const {
    if (!dense.is_same(user)) user.copy_(dense);
  }
};

// Tensors laid end to end in one buffer (lists of allgather, reduce_scatter, alltoall).
at::Tensor flatten(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const auto& t : ts) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

void unflatten_into(const at::Tensor& flat, std::vector<at::Tensor>& ts) {
  int64_t off = 0;
  for (auto& t : ts) {
    t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

std::vector<size_t> split_counts(const std::vector<int64_t>& splits, const at::Tensor& t, int size,
                                 const std::string& where) {
  const int64_t rows = t.dim() ? t.size(0) : 1, row = rows ? t.numel() / rows : 0;
  std::vector<size_t> counts(static_cast<size_t>(size));
  if (splits.empty()) {
    if (rows % size != 0)
      throw InvalidUsage(where + ": dim 0 of size " + std::to_string(rows) + " does not split evenly over " +
                         std::to_string(size) + " ranks; give split sizes");
    for (auto& c : counts) c = static_cast<size_t>(rows / size * row);
    return counts;
  }
  if (static_cast<int>(splits.size()) != size || std::accumulate(splits.begin(), splits.end(), int64_t{0}) != rows)
    throw InvalidUsage(where + ": split sizes must be one per rank (" + std::to_string(size) +
                       ") adding up to dim 0 (" + std::to_string(rows) + ")");
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = static_cast<size_t>(splits[i] * row);
  return counts;
}

int64_t offset_of(const std::vector<size_t>& counts, int j) {
  return static_cast<int64_t>(std::accumulate(counts.begin(), counts.begin() + j, size_t{0}));
}

std::vector<at::Tensor> one(const at::Tensor& t) { return {t}; }

}  // namespace

namespace {
std::mutex live_mu;
std::vector<ProcessGroupDtrain*>& live_groups() {
  static auto* groups = new std::vector<ProcessGroupDtrain*>();
  return *groups;
}
}  // namespace

void ProcessGroupDtrain::drain_all() {
  std::lock_guard<std::mutex> g(live_mu);
  for (auto* pg : live_groups()) {
    pg->collectives_->drain();
    pg->p2p_->drain();
  }
}

// --- ProcessGroupDtrain ---

ProcessGroupDtrain::ProcessGroupDtrain(std::shared_ptr<Store> store, int rank, int size, std::string name,
                                       GroupOptions options, int local_rank, int local_world_size, std::string job_id)
    : C10dBase(rank, size),
      store_(std::move(store)),
      name_(std::move(name)),
      job_id_(std::move(job_id)),
      options_(std::move(options)),
      local_rank_(local_rank),
      local_world_size_(local_world_size) {
  // The plugin the group surely needs is connected now, so a wrong name or an
  // unreachable peer fails init_process_group rather than the first op.
  comm_for(!options_.backend.empty() && options_.backend == "nccl");
  collectives_ = std::make_unique<ProgressQueue>();
  p2p_ = std::make_unique<ProgressQueue>();
  std::lock_guard<std::mutex> g(live_mu);
  live_groups().push_back(this);
}

ProcessGroupDtrain::~ProcessGroupDtrain() {
  // Python may drop the group holding the GIL while a progress thread runs a
  // future's Python callback (DDP's comm hooks): let go of it while joining.
  PyThreadState* saved = Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
  {
    std::lock_guard<std::mutex> g(live_mu);
    auto& v = live_groups();
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
  }
  if (!collectives_->empty() || !p2p_->empty()) {
    std::lock_guard<std::mutex> g(comms_mu_);
    for (auto& [plugin, comm] : comms_) comm->abort("the process group was destroyed with ops in flight");
  }
  collectives_.reset();
  p2p_.reset();
  if (saved) PyEval_RestoreThread(saved);
}

std::string ProcessGroupDtrain::plugin_for(bool cuda) const {
  if (!options_.backend.empty()) return options_.backend;
  return cuda ? "nccl" : "gloo";
}

std::shared_ptr<Communicator> ProcessGroupDtrain::comm_for(bool cuda) {
  const std::string plugin = plugin_for(cuda);
  std::lock_guard<std::mutex> g(comms_mu_);
  auto it = comms_.find(plugin);
  if (it != comms_.end()) return it->second;
  PluginRegistry registry(options_.plugin_dirs);
  auto backend = registry.load(plugin);
  CommOptions co;
  co.rank = getRank();
  co.world_size = getSize();
  co.local_rank = local_rank_;
  co.local_world_size = local_world_size_;
  co.store = store_;
  co.config_toml = options_.config_toml;
  co.timeout = options_.timeout;
  co.name = name_ + "/" + plugin;
  co.job_id = job_id_;
  auto comm = backend->create_communicator(co);
  comms_[plugin] = comm;
  return comm;
}

void ProcessGroupDtrain::unsupported(const std::string& what) const {
  throw NotSupported("backend 'dtrain' (plugin '" + plugin_for(false) + "') does not support " + what);
}

c10::intrusive_ptr<DtrainWork> ProcessGroupDtrain::make_work(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                             std::vector<std::shared_ptr<dtrain::Work>> works,
                                                             std::function<void()> copy_out) {
  return c10::make_intrusive<DtrainWork>(getRank(), type, std::move(outputs), std::move(works), std::move(copy_out));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::run(
    const char* op, bool cuda, const std::function<c10::intrusive_ptr<DtrainWork>(Communicator&)>& submit, bool p2p) {
  try {
    auto comm = comm_for(cuda);
    std::lock_guard<std::mutex> g(submit_mu_);
    auto work = submit(*comm);
    (p2p ? p2p_ : collectives_)->push(work);
    return work;
  } catch (const Error& e) {
    // torch.distributed raises RuntimeError for a backend's errors; the
    // message names the backend, the plugin and the op first.
    throw std::runtime_error("dtrain (plugin '" + plugin_for(cuda) + "') " + op + ": " + e.what());
  }
}

namespace {
void check_single(const std::vector<at::Tensor>& ts, const char* op) {
  if (ts.size() != 1)
    throw InvalidUsage(std::string(op) + ": one tensor per process (got " + std::to_string(ts.size()) +
                       "; several devices per process are not supported)");
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  check_single(tensors, "broadcast");
  return run("broadcast", tensors[0].is_cuda(), [&](Communicator& c) {
    Staged s(tensors[0]);
    auto w = c.broadcast(buffer_of(s.dense, "broadcast"), static_cast<int>(opts.rootRank));
    return make_work(c10d::OpType::BROADCAST, tensors, {w}, [s] { s.copy_back(); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  check_single(tensors, "allreduce");
  return run("allreduce", tensors[0].is_cuda(), [&](Communicator& c) {
    Staged s(tensors[0]);
    auto w = c.allreduce(buffer_of(s.dense, "allreduce"), reduce_op(opts.reduceOp, s.dense, "allreduce"));
    return make_work(c10d::OpType::ALLREDUCE, tensors, {w}, [s] { s.copy_back(); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                       const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) throw InvalidUsage("allreduce_coalesced: no tensors");
  for (const auto& t : tensors)
    if (t.scalar_type() != tensors[0].scalar_type() || t.device() != tensors[0].device())
      throw InvalidUsage("allreduce_coalesced: every tensor must have the first one's dtype and device");
  return run("allreduce_coalesced", tensors[0].is_cuda(), [&](Communicator& c) {
    at::Tensor flat = flatten(tensors);
    auto w = c.allreduce(buffer_of(flat, "allreduce_coalesced"), reduce_op(opts.reduceOp, flat, "allreduce_coalesced"));
    auto outs = tensors;
    return make_work(c10d::OpType::ALLREDUCE_COALESCED, tensors, {w},
                     [flat, outs]() mutable { unflatten_into(flat, outs); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  check_single(tensors, "reduce");
  return run("reduce", tensors[0].is_cuda(), [&](Communicator& c) {
    const int root = static_cast<int>(opts.rootRank);
    at::Tensor send = tensors[0].contiguous().clone();
    Staged s(tensors[0]);
    Buffer recv = getRank() == root ? buffer_of(s.dense, "reduce") : Buffer();
    auto w = c.reduce(buffer_of(send, "reduce"), recv, reduce_op(opts.reduceOp, send, "reduce"), root);
    const bool is_root = getRank() == root;
    return make_work(c10d::OpType::REDUCE, tensors, {w}, [s, send, is_root] {
      if (is_root) s.copy_back();
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions&) {
  check_single(inputs, "allgather");
  if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize())
    throw InvalidUsage("allgather: one output list of " + std::to_string(getSize()) + " tensors");
  for (const auto& t : outputs[0])
    if (t.numel() != inputs[0].numel() || t.scalar_type() != inputs[0].scalar_type())
      throw InvalidUsage("allgather: every output tensor must have the input's size and dtype");
  return run("allgather", inputs[0].is_cuda(), [&](Communicator& c) {
    at::Tensor in = inputs[0].contiguous();
    at::Tensor flat = at::empty({inputs[0].numel() * getSize()}, in.options());
    auto w = c.allgather(buffer_of(in, "allgather"), buffer_of(flat, "allgather"));
    auto outs = outputs[0];
    return make_work(c10d::OpType::ALLGATHER, outputs[0], {w},
                     [in, flat, outs]() mutable { unflatten_into(flat, outs); });
  });
}

namespace {
// all_gather_into_tensor's output holds `world` inputs; reduce_scatter_tensor's input `world` outputs.
void check_flat(const at::Tensor& big, const at::Tensor& small, int world, const char* op, const char* big_name,
                const char* small_name) {
  if (big.numel() != small.numel() * world || big.scalar_type() != small.scalar_type())
    throw InvalidUsage(std::string(op) + ": the " + big_name + " must hold world size (" + std::to_string(world) +
                       ") times the " + small_name + "'s elements, of its dtype");
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions&) {
  check_flat(output, input, getSize(), "all_gather_into_tensor", "output", "input");
  return run("_allgather_base", input.is_cuda(), [&](Communicator& c) {
    at::Tensor in = input.contiguous();
    Staged s(output);
    auto w = c.allgather(buffer_of(in, "_allgather_base"), buffer_of(s.dense, "_allgather_base"));
    return make_work(c10d::OpType::_ALLGATHER_BASE, one(output), {w}, [in, s] { s.copy_back(); });
  });
}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::run_coalesced(const char* op, c10d::OpType type,
                                                                 std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const FlatOp& submit) {
  if (inputs.empty() || outputs.size() != inputs.size()) throw InvalidUsage(std::string(op) + ": one output per input");
  const bool gather = type == c10d::OpType::_ALLGATHER_BASE;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (gather)
      check_flat(outputs[i], inputs[i], getSize(), op, "output", "input");
    else
      check_flat(inputs[i], outputs[i], getSize(), op, "input", "output");
  }
  return run(op, inputs[0].is_cuda(), [&](Communicator& c) {
    std::vector<at::Tensor> ins;
    std::vector<Staged> outs;
    std::vector<std::shared_ptr<dtrain::Work>> works;
    for (size_t i = 0; i < inputs.size(); ++i) {
      ins.push_back(inputs[i].contiguous());
      outs.emplace_back(outputs[i]);
      works.push_back(submit(c, ins.back(), outs.back().dense));
    }
    return make_work(type, outputs, works, [ins, outs] {
      for (const auto& s : outs) s.copy_back();
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                   std::vector<at::Tensor>& inputs,
                                                                                   const c10d::AllgatherOptions&) {
  const char* op = "allgather_into_tensor_coalesced";
  return run_coalesced(op, c10d::OpType::_ALLGATHER_BASE, outputs, inputs,
                       [op](Communicator& c, const at::Tensor& in, const at::Tensor& out) {
                         return c.allgather(buffer_of(in, op), buffer_of(out, op));
                       });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  return run_coalesced(op, c10d::OpType::_REDUCE_SCATTER_BASE, outputs, inputs,
                       [op, &opts](Communicator& c, const at::Tensor& in, const at::Tensor& out) {
                         return c.reduce_scatter(buffer_of(in, op), buffer_of(out, op),
                                                 reduce_op(opts.reduceOp, in, op));
                       });
}
#endif

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  check_single(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = getRank() == root;
  if (is_root && (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize()))
    throw InvalidUsage("gather: the root needs one output list of " + std::to_string(getSize()) + " tensors");
  if (is_root)
    for (const auto& t : outputs[0])
      if (t.numel() != inputs[0].numel() || t.scalar_type() != inputs[0].scalar_type())
        throw InvalidUsage("gather: every output tensor must have the input's size and dtype");
  return run("gather", inputs[0].is_cuda(), [&](Communicator& c) {
    at::Tensor in = inputs[0].contiguous();
    std::vector<std::shared_ptr<dtrain::Work>> works;
    std::vector<Staged> staged;
    if (is_root) {
      for (int j = 0; j < getSize(); ++j) staged.emplace_back(outputs[0][static_cast<size_t>(j)]);
      staged[static_cast<size_t>(root)].dense.copy_(in.view(staged[static_cast<size_t>(root)].dense.sizes()));
      for (int j = 0; j < getSize(); ++j)
        if (j != root)
          works.push_back(
              c.recv(buffer_of(staged[static_cast<size_t>(j)].dense, "gather"), j, Communicator::kAlltoallvTag));
    } else {
      works.push_back(c.send(buffer_of(in, "gather"), root, Communicator::kAlltoallvTag));
    }
    return make_work(c10d::OpType::GATHER, is_root ? outputs[0] : std::vector<at::Tensor>{}, works, [in, staged] {
      for (const auto& s : staged) s.copy_back();
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ScatterOptions& opts) {
  check_single(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = getRank() == root;
  if (is_root && (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize()))
    throw InvalidUsage("scatter: the root needs one input list of " + std::to_string(getSize()) + " tensors");
  if (is_root)
    for (const auto& t : inputs[0])
      if (t.numel() != outputs[0].numel() || t.scalar_type() != outputs[0].scalar_type())
        throw InvalidUsage("scatter: every input tensor must have the output's size and dtype");
  return run("scatter", outputs[0].is_cuda(), [&](Communicator& c) {
    Staged out(outputs[0]);
    std::vector<std::shared_ptr<dtrain::Work>> works;
    std::vector<at::Tensor> keep;
    if (is_root) {
      for (const auto& t : inputs[0]) keep.push_back(t.contiguous());
      out.dense.copy_(keep[static_cast<size_t>(root)].view(out.dense.sizes()));
      for (int j = 0; j < getSize(); ++j)
        if (j != root)
          works.push_back(c.send(buffer_of(keep[static_cast<size_t>(j)], "scatter"), j, Communicator::kAlltoallvTag));
    } else {
      works.push_back(c.recv(buffer_of(out.dense, "scatter"), root, Communicator::kAlltoallvTag));
    }
    return make_work(c10d::OpType::SCATTER, outputs, works, [out, keep] { out.copy_back(); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const c10d::ReduceScatterOptions& opts) {
  check_single(outputs, "reduce_scatter");
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize())
    throw InvalidUsage("reduce_scatter: one input list of " + std::to_string(getSize()) + " tensors");
  for (const auto& t : inputs[0])
    if (t.numel() != outputs[0].numel() || t.scalar_type() != outputs[0].scalar_type())
      throw InvalidUsage("reduce_scatter: every input tensor must have the output's size and dtype");
  return run("reduce_scatter", outputs[0].is_cuda(), [&](Communicator& c) {
    at::Tensor flat = flatten(inputs[0]);
    Staged s(outputs[0]);
    auto w = c.reduce_scatter(buffer_of(flat, "reduce_scatter"), buffer_of(s.dense, "reduce_scatter"),
                              reduce_op(opts.reduceOp, flat, "reduce_scatter"));
    return make_work(c10d::OpType::REDUCE_SCATTER, outputs, {w}, [flat, s] { s.copy_back(); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  check_flat(input, output, getSize(), "reduce_scatter_tensor", "input", "output");
  return run("_reduce_scatter_base", output.is_cuda(), [&](Communicator& c) {
    at::Tensor in = input.contiguous();
    Staged s(output);
    auto w = c.reduce_scatter(buffer_of(in, "_reduce_scatter_base"), buffer_of(s.dense, "_reduce_scatter_base"),
                              reduce_op(opts.reduceOp, in, "_reduce_scatter_base"));
    return make_work(c10d::OpType::_REDUCE_SCATTER_BASE, one(output), {w}, [in, s] { s.copy_back(); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_splits,
                                                                 std::vector<int64_t>& input_splits,
                                                                 const c10d::AllToAllOptions&) {
  if (output.scalar_type() != input.scalar_type())
    throw InvalidUsage("all_to_all_single: input and output must have the same dtype");
  return run("alltoall_base", input.is_cuda(), [&](Communicator& c) {
    at::Tensor in = input.contiguous();
    Staged s(output);
    if (output_splits.empty() && input_splits.empty() && in.numel() == s.dense.numel() && in.dim() > 0 &&
        in.size(0) % getSize() == 0) {
      auto w = c.alltoall(buffer_of(in, "alltoall_base"), buffer_of(s.dense, "alltoall_base"));
      return make_work(c10d::OpType::ALLTOALL_BASE, one(output), {w}, [in, s] { s.copy_back(); });
    }
    auto send_counts = split_counts(input_splits, in, getSize(), "all_to_all_single input");
    auto recv_counts = split_counts(output_splits, s.dense, getSize(), "all_to_all_single output");
    const int r = getRank();
    if (send_counts[static_cast<size_t>(r)] != recv_counts[static_cast<size_t>(r)])
      throw InvalidUsage("all_to_all_single: this rank sends itself " +
                         std::to_string(send_counts[static_cast<size_t>(r)]) + " elements but expects " +
                         std::to_string(recv_counts[static_cast<size_t>(r)]));
    at::Tensor in_w = wire_view(in).reshape({-1}), out_w = wire_view(s.dense).reshape({-1});
    const size_t scale = in.is_complex() ? 2 : 1;  // the wire carries complex as pairs
    for (auto* counts : {&send_counts, &recv_counts})
      for (auto& n : *counts) n *= scale;
    out_w.narrow(0, offset_of(recv_counts, r), static_cast<int64_t>(recv_counts[static_cast<size_t>(r)]))
        .copy_(in_w.narrow(0, offset_of(send_counts, r), static_cast<int64_t>(send_counts[static_cast<size_t>(r)])));
    auto works =
        c.alltoallv(buffer_of(in, "alltoall_base"), send_counts, buffer_of(s.dense, "alltoall_base"), recv_counts);
    return make_work(c10d::OpType::ALLTOALL_BASE, one(output), works, [in, s] { s.copy_back(); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions&) {
  if (static_cast<int>(outputs.size()) != getSize() || static_cast<int>(inputs.size()) != getSize())
    throw InvalidUsage("all_to_all: one input and one output tensor per rank (" + std::to_string(getSize()) + ")");
  for (size_t j = 0; j < outputs.size(); ++j)
    if (outputs[j].scalar_type() != inputs[0].scalar_type() || inputs[j].scalar_type() != inputs[0].scalar_type())
      throw InvalidUsage("all_to_all: every tensor must have the first input's dtype");
  const auto me = static_cast<size_t>(getRank());
  if (outputs[me].numel() != inputs[me].numel())
    throw InvalidUsage("all_to_all: this rank's own input and output tensors differ in size");
  return run("alltoall", inputs[0].is_cuda(), [&](Communicator& c) {
    at::Tensor send = flatten(inputs);
    int64_t total = 0;
    std::vector<size_t> send_counts, recv_counts;
    for (const auto& t : inputs) send_counts.push_back(static_cast<size_t>(wire_view(t).numel()));
    for (const auto& t : outputs) {
      recv_counts.push_back(static_cast<size_t>(wire_view(t).numel()));
      total += t.numel();
    }
    at::Tensor recv = at::empty({total}, send.options());
    const int r = getRank();
    outputs[static_cast<size_t>(r)].copy_(inputs[static_cast<size_t>(r)].view(outputs[static_cast<size_t>(r)].sizes()));
    auto works = c.alltoallv(buffer_of(send, "alltoall"), send_counts, buffer_of(recv, "alltoall"), recv_counts);
    auto outs = outputs;
    return make_work(c10d::OpType::ALLTOALL, outputs, works, [send, recv, outs, r]() mutable {
      int64_t off = 0;
      for (size_t j = 0; j < outs.size(); ++j) {
        if (static_cast<int>(j) != r) outs[j].copy_(recv.narrow(0, off, outs[j].numel()).view(outs[j].sizes()));
        off += outs[j].numel();
      }
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  check_single(tensors, "send");
  return run(
      "send", tensors[0].is_cuda(),
      [&](Communicator& c) {
        at::Tensor t = tensors[0].contiguous();
        auto w = c.send(buffer_of(t, "send"), dst, tag);
        return make_work(c10d::OpType::SEND, {}, {w}, [t] {});
      },
      true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  check_single(tensors, "recv");
  return run(
      "recv", tensors[0].is_cuda(),
      [&](Communicator& c) {
        Staged s(tensors[0]);
        auto w = c.recv(buffer_of(s.dense, "recv"), src, tag);
        return make_work(c10d::OpType::RECV, tensors, {w}, [s] { s.copy_back(); });
      },
      true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::recvAnysource(std::vector<at::Tensor>&, int) {
  unsupported("recv from any source (dist.recv without src): name the source rank");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::barrier(const c10d::BarrierOptions&) {
  return run("barrier", false, [&](Communicator& c) { return make_work(c10d::OpType::BARRIER, {}, {c.barrier()}); });
}

}  // namespace dtrain::python
