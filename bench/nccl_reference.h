#pragma once
// The raw-NCCL reference of `dtrain-bench collectives --backend nccl`: the NCCL
// calls dtrain's nccl plugin makes (ncclAllReduce, ncclBroadcast,
// ncclAllGather), made directly on an NCCL communicator of the bench's own
// (ncclCommInitRank, the unique id passed through the bench's store), on the
// same CUDA buffers and the same stream as dtrain's ops. Each call is followed
// by cudaStreamSynchronize: the op has finished on the GPU when it returns, as
// dtrain's blocking call has. What a program using NCCL without dtrain does, so
// dtrain's overhead is the difference.
//
// Built only when CUDA's runtime and NCCL are found (DTRAIN_BENCH_HAVE_NCCL);
// no CUDA type appears here, so the rest of the bench compiles without CUDA.
// One rank's objects are used from its one thread.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/buffer.h"
#include "dtrain/store.h"

namespace dtrain::bench {

// The number of visible CUDA devices; throws NotSupported naming CUDA's reason
// when there is none (no driver: cudaGetDeviceCount fails and leaves its count
// unwritten).
int cuda_devices_or_throw();
// "NCCL 2.28.9 (built against 2.28.9), CUDA runtime 13.0" for the header.
std::string nccl_reference_versions();

// One rank's CUDA device, stream and device memory (freed with it). Every
// CUDA call is checked; a failure throws IoError naming CUDA's error.
class CudaArena {
 public:
  explicit CudaArena(int device);
  ~CudaArena();
  CudaArena(const CudaArena&) = delete;
  CudaArena& operator=(const CudaArena&) = delete;

  int device() const { return device_; }
  // A cudaStream_t (non-blocking), shared by dtrain's ops and the reference.
  void* stream() const { return stream_; }
  // bytes (at least 1) of zeroed device memory.
  void* alloc(size_t bytes);
  // Synchronous copies and memset on the stream.
  void upload(void* device_dst, const void* host_src, size_t bytes);
  void download(void* host_dst, const void* device_src, size_t bytes);
  void zero(void* device_dst, size_t bytes);

 private:
  int device_;
  void* stream_ = nullptr;
  std::vector<void*> blocks_;
};

class NcclReference {
 public:
  // Collective over all ranks: rank 0 makes the unique id and sets it in
  // store, the others wait up to timeout for it; then ncclCommInitRank.
  NcclReference(int rank, int size, const CudaArena& cuda, std::shared_ptr<Store> store,
                std::chrono::milliseconds timeout);
  ~NcclReference();

  // Each enqueues one NCCL call on the arena's stream and synchronizes it.
  void allreduce(void* ptr, size_t count, DType t);  // sum, in place
  void broadcast(void* ptr, size_t count, DType t, int root);
  void allgather(const void* send, void* recv, size_t count_per_rank, DType t);
  void barrier();  // a one-element all-reduce, as the plugin's barrier

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::bench
