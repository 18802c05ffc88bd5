#include "nccl_reference.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::bench {

namespace {

void check(cudaError_t st, const std::string& what) {
  if (st == cudaSuccess) return;
  cudaGetLastError();
  throw IoError(
      fmt::format("raw NCCL reference: {} failed: {}: {}", what, cudaGetErrorName(st), cudaGetErrorString(st)));
}

void check(ncclResult_t r, const std::string& what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  throw IoError(
      fmt::format("raw NCCL reference: {} failed: {}: {}", what, ncclGetErrorString(r), ncclGetLastError(comm)));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::I8: return ncclInt8;
    case DType::U8: return ncclUint8;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
  }
  throw InvalidUsage("raw NCCL reference: unknown dtype");
}

std::string dotted(int major, int minor, int patch) { return fmt::format("{}.{}.{}", major, minor, patch); }

}  // namespace

int cuda_devices_or_throw() {
  int n = 0;  // left unwritten when cudaGetDeviceCount fails
  cudaError_t st = cudaGetDeviceCount(&n);
  cudaGetLastError();
  if (st != cudaSuccess)
    throw NotSupported(fmt::format("no CUDA device is visible (cudaGetDeviceCount: {})", cudaGetErrorString(st)));
  if (n <= 0) {
    const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
    throw NotSupported(fmt::format("no CUDA device is visible (cudaGetDeviceCount: 0 devices{})",
                                   v ? fmt::format(", CUDA_VISIBLE_DEVICES='{}'", v) : ""));
  }
  return n;
}

std::string nccl_reference_versions() {
  int v = 0, rt = 0;
  std::string nccl = ncclGetVersion(&v) == ncclSuccess && v > 0 ? dotted(v / 10000, v % 10000 / 100, v % 100) : "?";
  std::string cuda = cudaRuntimeGetVersion(&rt) == cudaSuccess ? fmt::format("{}.{}", rt / 1000, rt % 1000 / 10) : "?";
  cudaGetLastError();
  return fmt::format("NCCL {} (built against {}), CUDA runtime {}", nccl, dotted(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),
                     cuda);
}

// ---- CudaArena ----

CudaArena::CudaArena(int device) : device_(device) {
  check(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device));
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  stream_ = s;
}

CudaArena::~CudaArena() {
  cudaSetDevice(device_);
  auto s = static_cast<cudaStream_t>(stream_);
  if (s) cudaStreamSynchronize(s);
  for (void* p : blocks_) cudaFree(p);
  if (s) cudaStreamDestroy(s);
  cudaGetLastError();
}

void* CudaArena::alloc(size_t bytes) {
  void* p = nullptr;
  bytes = std::max<size_t>(bytes, 1);
  check(cudaMalloc(&p, bytes), fmt::format("cudaMalloc of {} bytes on cuda:{}", bytes, device_));
  blocks_.push_back(p);
  zero(p, bytes);
  return p;
}

void CudaArena::upload(void* device_dst, const void* host_src, size_t bytes) {
  auto s = static_cast<cudaStream_t>(stream_);
  check(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (to the GPU)");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

void CudaArena::download(void* host_dst, const void* device_src, size_t bytes) {
  auto s = static_cast<cudaStream_t>(stream_);
  check(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync (to the host)");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

void CudaArena::zero(void* device_dst, size_t bytes) {
  auto s = static_cast<cudaStream_t>(stream_);
  check(cudaMemsetAsync(device_dst, 0, bytes, s), "cudaMemsetAsync");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

// ---- NcclReference ----

struct NcclReference::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  float* scratch = nullptr;

  void sync(const char* what) {
    check(cudaStreamSynchronize(stream), std::string("cudaStreamSynchronize after ") + what);
    // An NCCL failure (a peer gone) shows here, not in the call's result.
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError", comm);
    check(async, what, comm);
  }
};

NcclReference::NcclReference(int rank, int size, const CudaArena& cuda, std::shared_ptr<Store> store,
                             std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.device = cuda.device();
  m.stream = static_cast<cudaStream_t>(cuda.stream());
  check(cudaSetDevice(m.device), "cudaSetDevice");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank == 0) {
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    store->set("id", Bytes(id.internal, id.internal + sizeof(id.internal)));
  } else {
    Bytes v = store->get("id", timeout);
    if (v.size() != sizeof(id.internal))
      throw InternalError(fmt::format("raw NCCL reference: the unique id in the store has {} bytes, not {}", v.size(),
                                      sizeof(id.internal)));
    std::memcpy(id.internal, v.data(), v.size());
  }
  check(ncclCommInitRank(&m.comm, size, id, rank), fmt::format("ncclCommInitRank (rank {} of {})", rank, size));
  check(cudaMalloc(reinterpret_cast<void**>(&m.scratch), sizeof(float)), "cudaMalloc");
  check(cudaMemset(m.scratch, 0, sizeof(float)), "cudaMemset");
}

NcclReference::~NcclReference() {
  auto& m = *impl_;
  cudaSetDevice(m.device);
  if (m.stream) cudaStreamSynchronize(m.stream);
  if (m.scratch) cudaFree(m.scratch);
  if (m.comm) {
    if (ncclCommFinalize(m.comm) == ncclSuccess)
      ncclCommDestroy(m.comm);
    else
      ncclCommAbort(m.comm);
  }
  cudaGetLastError();
}

void NcclReference::allreduce(void* ptr, size_t count, DType t) {
  auto& m = *impl_;
  check(ncclAllReduce(ptr, ptr, count, nccl_type(t), ncclSum, m.comm, m.stream), "ncclAllReduce", m.comm);
  m.sync("ncclAllReduce");
}

void NcclReference::broadcast(void* ptr, size_t count, DType t, int root) {
  auto& m = *impl_;
  check(ncclBroadcast(ptr, ptr, count, nccl_type(t), root, m.comm, m.stream), "ncclBroadcast", m.comm);
  m.sync("ncclBroadcast");
}

void NcclReference::allgather(const void* send, void* recv, size_t count_per_rank, DType t) {
  auto& m = *impl_;
  check(ncclAllGather(send, recv, count_per_rank, nccl_type(t), m.comm, m.stream), "ncclAllGather", m.comm);
  m.sync("ncclAllGather");
}

void NcclReference::barrier() {
  auto& m = *impl_;
  check(ncclAllReduce(m.scratch, m.scratch, 1, ncclFloat32, ncclSum, m.comm, m.stream), "ncclAllReduce (barrier)",
        m.comm);
  m.sync("the barrier");
}

}  // namespace dtrain::bench
