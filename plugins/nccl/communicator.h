#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "dtrain/sdk/backend.h"
#include "work.h"

namespace dtrain::nccl_backend {

// The [nccl] keys as the job file sets them; the initializers are the
// defaults. Each key is declared once, with its bound and doc, in nccl_keys()
// (plugin.cc), which reads them all, bounds checked.
struct NcclKeys {
  int device = -1;
};
const sdk::ConfigTable<NcclKeys>& nccl_keys();

// ncclAlltoAll's signature (NCCL 2.28.3+), looked up in the loaded libnccl at
// run time so the plugin also loads against an older one.
using AlltoAllFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);

class P2pWork;

// Send/recv posted since the last flush. NCCL matches point-to-point calls per
// peer in posting order, and a lone ncclSend blocks its stream until the peer
// posts the matching receive, so two ranks exchanging on one stream would
// deadlock if each call were issued alone. They are issued together, as one
// ncclGroupStart/End, at the first test/wait of any of them or before the next
// collective. Shared by the communicator and its p2p works (weakly).
class P2pBatch {
 public:
  explicit P2pBatch(std::shared_ptr<NcclState> state) : state_(std::move(state)) {}
  void add(bool is_send, const dt_buffer_v1_t& buf, int peer, cudaStream_t stream, sdk::Clock::time_point deadline,
           const std::shared_ptr<P2pWork>& work);
  // Issues every pending call as one group; on failure fails their works.
  // The submitting thread (before a collective) waits for a flush in
  // progress and gets the failure thrown; a testing thread returns at once
  // if another one is flushing.
  void flush(bool submitter);

 private:
  struct Entry {
    bool is_send;
    dt_buffer_v1_t buf;
    int peer;
    cudaStream_t stream;
    sdk::Clock::time_point deadline;
    std::weak_ptr<P2pWork> work;
  };
  std::mutex mu_;
  std::shared_ptr<NcclState> state_;
  std::vector<Entry> pending_;
};

// A send or recv: pending in a P2pBatch until flushed, then an EventWork.
class P2pWork : public PolledWork {
 public:
  P2pWork(std::weak_ptr<P2pBatch> batch, std::string what) : batch_(std::move(batch)), what_(std::move(what)) {}
  dt_status_t test() override;
  void issued(std::shared_ptr<EventWork> inner);
  const std::string& what() const { return what_; }

 private:
  std::weak_ptr<P2pBatch> batch_;
  std::string what_;
  std::mutex inner_mu_;
  std::shared_ptr<EventWork> inner_;
};

// Waits out a nonblocking NCCL call that returned ncclInProgress (polling the
// communicator's asynchronous error) until deadline; throws on an error,
// abort or timeout, naming what.
// last_error: ncclGetLastError when r is an error.
void finish_nccl_call(NcclState& state, ncclResult_t r, const std::string& what, sdk::Clock::time_point deadline,
                      const std::string& last_error);

// One NCCL communicator on one CUDA device (option `device`, else the
// launcher's DTRAIN_DEVICE, else local_rank modulo the visible devices).
// Created nonblocking under the init deadline, with the unique id passed
// through the core's store. Every op is enqueued on the stream its buffers
// name (NULL: the legacy default stream) and returns an EventWork; barrier
// runs on the communicator's own stream. Submission waits only for NCCL's own
// enqueue (which connects to peers at the first op), bounded by the op's
// deadline and cut short by abort.
class NcclCommunicator : public sdk::Communicator {
 public:
  explicit NcclCommunicator(const sdk::CommInit& init);
  ~NcclCommunicator() override;

  DTRAIN_SDK_COMMUNICATOR_OPS;

 private:
  template <typename F>
  std::shared_ptr<sdk::Work> enqueue(const std::string& what, cudaStream_t stream, const Opts& o, F&& call);
  cudaStream_t check_pair(const char* op, const Buf& send, const Buf& recv) const;
  void check_buffer(const char* op, const Buf& b) const;
  std::shared_ptr<sdk::Work> post(const Buf& buf, int32_t peer, const Opts& o, bool is_send);

  int rank_ = 0;
  int world_size_ = 1;
  int device_ = 0;
  int64_t timeout_ms_ = 0;
  std::shared_ptr<NcclState> state_;
  std::shared_ptr<P2pBatch> p2p_;
  cudaStream_t own_stream_ = nullptr;
  float* scratch_ = nullptr;  // barrier's one element
  AlltoAllFn alltoall_ = nullptr;
};

// An entry point of the libnccl this plugin was linked to (the one loaded), or
// nullptr. The newer ones (kNewerEntryPoints) are looked up at run time, so
// the plugin also loads against an older libnccl.
void* find_nccl_symbol(const char* name);
// Used where the loaded libnccl has it: ncclAlltoAll (alltoall). Looked up and
// named in the description only (the core has no shrink, revoke or buffer
// registration to map them to yet): the others.
inline constexpr const char* kNewerEntryPoints[] = {"ncclAlltoAll", "ncclCommShrink", "ncclCommRevoke",
                                                    "ncclCommRegister"};

// "no CUDA device is visible (...)": the check comm_create makes first, so a
// CPU-only machine fails at once, before waiting for any peer. Returns the
// number of visible devices, or throws DT_ERR_NOT_SUPPORTED.
int visible_devices_or_throw();

}  // namespace dtrain::nccl_backend
