#pragma once
// dtrain's c10d backend: torch.distributed's ops over the core's Communicator.
//
// A thin adapter. Every op checks and lays out its tensors (flattening lists,
// making strided tensors contiguous), hands the core a Buffer and returns a
// c10d::Work over the core's Work. Reductions, CUDA staging, deadlines and
// abort stay in the core and the plugin, so every plugin behaves the same
// from Python as from C++; no plugin knows Python.
//
// Threads: ops are submitted from any Python thread or from autograd's (DDP's
// reducer), one at a time (a mutex keeps the core's submission order); a
// progress thread per group completes the collectives in submission order,
// another the point-to-point ops, copying results out and completing their
// futures (DDP's comm hooks chain on them). A waiter completes a work itself
// when it gets there first.

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "c10d_compat.h"
#include "dtrain/communicator.h"
#include "dtrain/store.h"
#include "work.h"

namespace dtrain::python {

// How a group chooses and configures its plugin.
struct GroupOptions {
  // The plugin for tensors on every device; "" picks gloo for CPU tensors
  // and nccl for CUDA tensors (each created at its first op).
  std::string backend;
  std::string config_toml;  // the plugin's own table, flat TOML ("key = literal" lines)
  std::vector<std::string> plugin_dirs;
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
};

class ProcessGroupDtrain : public C10dBase {
 public:
  // store: the group's rendezvous (already scoped to the group); name: the
  // communicators' scope in it, the same on every rank of the group.
  ProcessGroupDtrain(std::shared_ptr<Store> store, int rank, int size, std::string name, GroupOptions options,
                     int local_rank = 0, int local_world_size = 1, std::string job_id = "");
  ~ProcessGroupDtrain() override;

  const std::string getBackendName() const override { return "dtrain"; }
  // The plugin that carries tensors of device type `cuda` (false: CPU).
  std::string plugin_for(bool cuda) const;
  const GroupOptions& options() const { return options_; }
  // Waits until every op of every live group has completed: called at
  // interpreter exit (atexit), while Python can still run the futures'
  // callbacks; a callback that runs during finalization kills its thread.
  static void drain_all();

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
#if TORCH_VERSION_MAJOR >= 2
  // FSDP2 (fully_shard) and DTensor gather and scatter several tensors in one call.
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
#endif
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

 private:
  std::shared_ptr<Communicator> comm_for(bool cuda);
  std::shared_ptr<Communicator> comm_for(const at::Tensor& t) { return comm_for(t.is_cuda()); }
  [[noreturn]] void unsupported(const std::string& what) const;
  // Runs an op's submission under the submit lock; core errors come out
  // prefixed with the backend, the plugin and the op.
  c10::intrusive_ptr<c10d::Work> run(const char* op, bool cuda,
                                     const std::function<c10::intrusive_ptr<DtrainWork>(Communicator&)>& submit,
                                     bool p2p = false);
#if TORCH_VERSION_MAJOR >= 2
  // The *_coalesced ops: one Work over submit(comm, input, output) for each
  // pair, the gathered (_ALLGATHER_BASE) or scattered (_REDUCE_SCATTER_BASE)
  // tensor holding world size times the other's elements.
  using FlatOp =
      std::function<std::shared_ptr<dtrain::Work>(Communicator&, const at::Tensor& in, const at::Tensor& out)>;
  c10::intrusive_ptr<c10d::Work> run_coalesced(const char* op, c10d::OpType type, std::vector<at::Tensor>& outputs,
                                               std::vector<at::Tensor>& inputs, const FlatOp& submit);
#endif
  c10::intrusive_ptr<DtrainWork> make_work(c10d::OpType type, std::vector<at::Tensor> outputs,
                                           std::vector<std::shared_ptr<dtrain::Work>> works,
                                           std::function<void()> copy_out = nullptr);

  std::shared_ptr<Store> store_;
  std::string name_, job_id_;
  GroupOptions options_;
  int local_rank_, local_world_size_;
  mutable std::mutex comms_mu_;
  std::map<std::string, std::shared_ptr<Communicator>> comms_;  // by plugin
  std::mutex submit_mu_;
  // Collectives complete in order on one thread, point-to-point ops on
  // another: an irecv waiting for its peer never holds back a collective's
  // future (ranks issue collectives in one order, p2p ops in any).
  std::unique_ptr<ProgressQueue> collectives_, p2p_;
};

}  // namespace dtrain::python
