#include "communicator.h"

#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace dtrain::nccl_backend {

namespace {

using Clock = sdk::Clock;

ncclDataType_t nccl_dtype(int32_t dtype) {
  switch (dtype) {
    case DT_DTYPE_F32: return ncclFloat32;
    case DT_DTYPE_F64: return ncclFloat64;
    case DT_DTYPE_F16: return ncclFloat16;
    case DT_DTYPE_BF16: return ncclBfloat16;
    case DT_DTYPE_I8: return ncclInt8;
    case DT_DTYPE_U8: return ncclUint8;
    case DT_DTYPE_I32: return ncclInt32;
    case DT_DTYPE_I64: return ncclInt64;
  }
  sdk::fail(DT_ERR_INVALID_USAGE, "nccl: unknown dtype code " + std::to_string(dtype));
}

ncclRedOp_t nccl_op(int32_t op) {
  switch (op) {
    case DT_OP_SUM: return ncclSum;
    case DT_OP_AVG: return ncclAvg;
    case DT_OP_MAX: return ncclMax;
    case DT_OP_MIN: return ncclMin;
    case DT_OP_PROD: return ncclProd;
  }
  sdk::fail(DT_ERR_INVALID_USAGE, "nccl: unknown reduction op code " + std::to_string(op));
}

std::string describe(const char* op, const dt_buffer_v1_t& b, int32_t red = -1) {
  std::string s = std::string(op) + " of " + std::to_string(b.count) + " " + sdk::dtype_name(b.dtype);
  if (red >= 0) s += std::string(" (") + sdk::op_name(red) + ")";
  return s;
}

int pick_device(const sdk::CommInit& init, int visible) {
  int64_t d = nccl_keys().read(init.options).device;  // bound checked there
  std::string from = "option nccl.device";
  if (d < 0) {
    if (const char* e = std::getenv("DTRAIN_DEVICE"); e && *e) {
      // "3" or "cuda:3"
      const char* digits = std::strrchr(e, ':') ? std::strrchr(e, ':') + 1 : e;
      char* end = nullptr;
      d = std::strtol(digits, &end, 10);
      if (end == digits || *end != '\0' || d < 0)
        sdk::fail(DT_ERR_INVALID_USAGE, std::string("nccl: DTRAIN_DEVICE='") + e + "' is not a CUDA device number");
      from = std::string("DTRAIN_DEVICE=") + e;
    } else {
      d = init.local_rank % visible;
      from = "local rank " + std::to_string(init.local_rank);
    }
  }
  if (d >= visible)
    sdk::fail(DT_ERR_INVALID_USAGE, "nccl: rank " + std::to_string(init.rank) + ": CUDA device " + std::to_string(d) +
                                        " (from " + from + ") does not exist; " + std::to_string(visible) +
                                        " visible (0.." + std::to_string(visible - 1) + ")");
  return static_cast<int>(d);
}

}  // namespace

// Found in the libnccl already loaded (through a symbol we know it has).
void* find_nccl_symbol(const char* name) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) == 0 || info.dli_fname == nullptr) return nullptr;
  void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  void* fn = dlsym(lib, name);
  dlclose(lib);  // RTLD_NOLOAD took a reference; the library stays loaded through our own link
  return fn;
}

int visible_devices_or_throw() {
  int n = 0;  // cudaGetDeviceCount leaves it unwritten when it fails (no driver)
  cudaError_t st = cudaGetDeviceCount(&n);
  cudaGetLastError();
  std::string why;
  if (st != cudaSuccess) {
    why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(st);
  } else if (n <= 0) {
    why = "cudaGetDeviceCount: 0 devices";
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) why += std::string(", CUDA_VISIBLE_DEVICES='") + v + "'";
  } else {
    return n;
  }
  sdk::fail(DT_ERR_NOT_SUPPORTED,
            "nccl: no CUDA device is visible (" + why + "); use --backend gloo or --backend ucx on CPU-only machines");
}

void finish_nccl_call(NcclState& state, ncclResult_t r, const std::string& what, Clock::time_point deadline,
                      const std::string& last_error) {
  if (r != ncclSuccess && r != ncclInProgress)
    sdk::fail(status_of(r),
              "nccl: " + what + " failed: " + ncclGetErrorString(r) + (last_error.empty() ? "" : ": " + last_error));
  auto start = Clock::now();
  while (r == ncclInProgress) {
    if (state.aborted()) sdk::fail(DT_ERR_ABORTED, "nccl: " + what + " aborted: " + state.abort_reason());
    std::string msg;
    r = state.poll_async_error(&msg);
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) sdk::fail(status_of(r), "nccl: " + what + " failed: " + msg);
    auto now = Clock::now();
    if (now >= deadline)
      sdk::fail(DT_ERR_TIMEOUT,
                "nccl: rank " + std::to_string(state.rank()) + ": " + what + " was still being enqueued after " +
                    std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count()) +
                    " ms (NCCL connects to its peers at the first op: is every rank running it? "
                    "NCCL_DEBUG=INFO shows where it waits)");
    std::this_thread::sleep_for(std::chrono::microseconds(now - start < std::chrono::milliseconds(1) ? 20 : 500));
  }
  if (r != ncclSuccess) sdk::fail(status_of(r), "nccl: " + what + " failed: " + ncclGetErrorString(r));
}

// ---- P2pBatch / P2pWork ----

void P2pBatch::add(bool is_send, const dt_buffer_v1_t& buf, int peer, cudaStream_t stream, Clock::time_point deadline,
                   const std::shared_ptr<P2pWork>& work) {
  std::lock_guard<std::mutex> lk(mu_);
  pending_.push_back(Entry{is_send, buf, peer, stream, deadline, work});
}

void P2pBatch::flush(bool submitter) {
  std::unique_lock<std::mutex> lk(mu_, std::defer_lock);
  if (submitter)
    lk.lock();
  else if (!lk.try_lock())
    return;  // another thread is issuing the batch
  if (pending_.empty()) return;
  std::vector<Entry> batch;
  batch.swap(pending_);
  try {
    check_cuda(cudaSetDevice(state_->device()), "cudaSetDevice");
    Clock::time_point deadline = batch.front().deadline;
    for (auto& e : batch) deadline = std::min(deadline, e.deadline);
    std::string last;
    ncclResult_t r = state_->call(
        [&](ncclComm_t comm) {
          ncclResult_t r = ncclGroupStart();
          for (auto& e : batch) {
            if (r != ncclSuccess) break;
            auto t = nccl_dtype(e.buf.dtype);
            r = e.is_send ? ncclSend(e.buf.ptr, e.buf.count, t, e.peer, comm, e.stream)
                          : ncclRecv(e.buf.ptr, e.buf.count, t, e.peer, comm, e.stream);
          }
          ncclResult_t end = ncclGroupEnd();
          return r == ncclSuccess ? end : r;
        },
        &last);
    finish_nccl_call(*state_, r, std::to_string(batch.size()) + " grouped send/recv", deadline, last);
    for (auto& e : batch)
      if (auto w = e.work.lock()) w->issued(std::make_shared<EventWork>(state_, e.stream, w->what()));
  } catch (const sdk::Error& err) {
    for (auto& e : batch)
      if (auto w = e.work.lock()) w->complete(err.status(), std::string(err.what()) + " (" + w->what() + ")");
    if (submitter) throw;
  }
}

dt_status_t P2pWork::test() {
  dt_status_t s = sdk::Work::test();
  if (s != DT_IN_PROGRESS) return s;
  std::shared_ptr<EventWork> inner;
  {
    std::lock_guard<std::mutex> lk(inner_mu_);
    inner = inner_;
  }
  if (!inner) {
    if (auto b = batch_.lock())
      b->flush(/*submitter=*/false);
    else
      complete(DT_ERR_ABORTED, "nccl: " + what_ + ": the communicator was destroyed before it was issued");
    std::lock_guard<std::mutex> lk(inner_mu_);
    inner = inner_;
  }
  if (inner) {
    s = inner->test();
    if (s != DT_IN_PROGRESS) complete(s, inner->error());
  }
  return sdk::Work::test();
}

void P2pWork::issued(std::shared_ptr<EventWork> inner) {
  std::lock_guard<std::mutex> lk(inner_mu_);
  inner_ = std::move(inner);
}

// ---- NcclCommunicator ----

NcclCommunicator::NcclCommunicator(const sdk::CommInit& init)
    : rank_(init.rank), world_size_(init.world_size), timeout_ms_(init.timeout_ms) {
  int visible = visible_devices_or_throw();
  device_ = pick_device(init, visible);
  const std::string me = "nccl: rank " + std::to_string(rank_) + " of " + std::to_string(world_size_);
  check_cuda(cudaSetDevice(device_), "cudaSetDevice(" + std::to_string(device_) + ")");
  auto deadline = sdk::deadline_after(0, timeout_ms_);

  // The unique id: rank 0 makes it, the others read it from the store.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  init.store.set("nccl/joined/" + std::to_string(rank_), "1");
  if (rank_ == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) sdk::fail(status_of(r), me + ": ncclGetUniqueId: " + ncclGetErrorString(r));
    init.store.set("nccl/unique_id", std::string(id.internal, sizeof(id.internal)));
  } else {
    std::string v;
    try {
      v = init.store.get("nccl/unique_id", timeout_ms_);
    } catch (const sdk::Error& e) {
      sdk::fail(e.status(), me + ": waiting for rank 0's NCCL unique id: " + e.what());
    }
    if (v.size() != sizeof(id.internal))
      sdk::fail(DT_ERR_INTERNAL, me + ": the NCCL unique id in the store has " + std::to_string(v.size()) +
                                     " bytes, not " + std::to_string(sizeof(id.internal)));
    std::memcpy(id.internal, v.data(), v.size());
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, world_size_, id, rank_, &config);
  if (comm == nullptr)
    sdk::fail(status_of(r) == DT_OK ? DT_ERR_INTERNAL : status_of(r),
              me + ": ncclCommInitRankConfig: " + ncclGetErrorString(r) + ": " + ncclGetLastError(nullptr));
  std::string last = r == ncclSuccess || r == ncclInProgress ? "" : ncclGetLastError(comm);
  state_ = std::make_shared<NcclState>(comm, device_, rank_, world_size_);
  try {
    finish_nccl_call(*state_, r, "communicator init (ncclCommInitRankConfig)", deadline, last);
  } catch (const sdk::Error& e) {
    state_->abort("init failed");
    std::string why = e.what();
    if (why.rfind("nccl: ", 0) == 0) why = why.substr(6);
    why = me + ": " + why;
    std::string missing;
    for (int q = 0; q < world_size_ && e.status() == DT_ERR_TIMEOUT; ++q) {
      try {
        init.store.get("nccl/joined/" + std::to_string(q), 1);
      } catch (const sdk::Error&) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(q);
      }
    }
    if (e.status() == DT_ERR_TIMEOUT)
      why = me + ": communicator init did not finish within " + std::to_string(timeout_ms_) + " ms; " +
            (missing.empty() ? "every rank reached it, so NCCL could not connect them (check NCCL_SOCKET_IFNAME, "
                               "NCCL_DEBUG=INFO)"
                             : "waiting for rank(s) " + missing + ", which never started it");
    sdk::fail(e.status(), why);
  }
  p2p_ = std::make_shared<P2pBatch>(state_);
  try {
    check_cuda(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(float)), "cudaMalloc of the barrier scratch");
    check_cuda(cudaMemset(scratch_, 0, sizeof(float)), "cudaMemset");
  } catch (const sdk::Error&) {
    state_->abort("init failed");
    if (scratch_) cudaFree(scratch_);
    if (own_stream_) cudaStreamDestroy(own_stream_);
    throw;
  }
  alltoall_ = reinterpret_cast<AlltoAllFn>(find_nccl_symbol("ncclAlltoAll"));
  int v = 0;
  ncclGetVersion(&v);
  sdk::Log::info(me + " on cuda:" + std::to_string(device_) + ", NCCL " + std::to_string(v) +
                 ", alltoall: " + (alltoall_ ? "ncclAlltoAll" : "grouped send/recv"));
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device_);
  if (own_stream_) {
    cudaError_t st = cudaStreamSynchronize(own_stream_);
    if (st != cudaSuccess) sdk::Log::warn(std::string("nccl: cudaStreamSynchronize: ") + cudaGetErrorString(st));
    cudaStreamDestroy(own_stream_);
  }
  if (scratch_) cudaFree(scratch_);
  cudaGetLastError();
}

void NcclCommunicator::abort(const std::string& reason) {
  if (state_) state_->abort(reason);
}

void NcclCommunicator::check_buffer(const char* op, const Buf& b) const {
  if (b.device_type != DT_DEVICE_CUDA)
    sdk::fail(DT_ERR_NOT_SUPPORTED, std::string("nccl: ") + op +
                                        ": the nccl backend takes CUDA buffers only (use gloo or ucx for CPU buffers)");
  if (b.device_id != device_)
    sdk::fail(DT_ERR_INVALID_USAGE, std::string("nccl: ") + op + ": buffer on cuda:" + std::to_string(b.device_id) +
                                        ", but this communicator runs on cuda:" + std::to_string(device_));
  if (b.ptr == nullptr && b.count > 0)
    sdk::fail(DT_ERR_INVALID_USAGE,
              std::string("nccl: ") + op + ": null buffer with " + std::to_string(b.count) + " elements");
  nccl_dtype(b.dtype);
}

cudaStream_t NcclCommunicator::check_pair(const char* op, const Buf& send, const Buf& recv) const {
  check_buffer(op, send);
  check_buffer(op, recv);
  if (send.dtype != recv.dtype)
    sdk::fail(DT_ERR_INVALID_USAGE, std::string("nccl: ") + op + ": send is " + sdk::dtype_name(send.dtype) +
                                        ", recv is " + sdk::dtype_name(recv.dtype));
  if (send.stream && recv.stream && send.stream != recv.stream)
    sdk::fail(DT_ERR_INVALID_USAGE,
              std::string("nccl: ") + op + ": send and recv name different CUDA streams; one op runs on one stream");
  return static_cast<cudaStream_t>(send.stream ? send.stream : recv.stream);
}

template <typename F>
std::shared_ptr<sdk::Work> NcclCommunicator::enqueue(const std::string& what, cudaStream_t stream, const Opts& o,
                                                     F&& call) {
  if (state_->aborted()) sdk::fail(DT_ERR_ABORTED, "nccl: " + what + ": aborted: " + state_->abort_reason());
  if (std::string f = state_->failure(); !f.empty())
    sdk::fail(DT_ERR_REMOTE, "nccl: " + what + ": the communicator failed earlier: " + f);
  p2p_->flush(/*submitter=*/true);
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  std::string last;
  ncclResult_t r = state_->call(call, &last);
  finish_nccl_call(*state_, r, what, sdk::deadline_after(o.timeout_ms, timeout_ms_), last);
  return std::make_shared<EventWork>(state_, stream, what);
}

std::shared_ptr<sdk::Work> NcclCommunicator::allreduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o) {
  cudaStream_t s = check_pair("allreduce", send, recv);
  if (send.count != recv.count) sdk::fail(DT_ERR_INVALID_USAGE, "nccl: allreduce: send and recv counts differ");
  auto red = nccl_op(op);
  return enqueue(describe("allreduce", send, op), s, o, [&](ncclComm_t c) {
    return ncclAllReduce(send.ptr, recv.ptr, send.count, nccl_dtype(send.dtype), red, c, s);
  });
}

std::shared_ptr<sdk::Work> NcclCommunicator::broadcast(const Buf& buf, const Opts& o) {
  check_buffer("broadcast", buf);
  if (o.root < 0 || o.root >= world_size_) sdk::fail(DT_ERR_INVALID_USAGE, "nccl: broadcast: root out of range");
  auto s = static_cast<cudaStream_t>(buf.stream);
  return enqueue(describe("broadcast", buf), s, o, [&](ncclComm_t c) {
    return ncclBroadcast(buf.ptr, buf.ptr, buf.count, nccl_dtype(buf.dtype), o.root, c, s);
  });
}

std::shared_ptr<sdk::Work> NcclCommunicator::allgather(const Buf& send, const Buf& recv, const Opts& o) {
  cudaStream_t s = check_pair("allgather", send, recv);
  if (recv.count != send.count * static_cast<uint64_t>(world_size_))
    sdk::fail(DT_ERR_INVALID_USAGE, "nccl: allgather: recv.count must be send.count * world_size");
  return enqueue(describe("allgather", send), s, o, [&](ncclComm_t c) {
    return ncclAllGather(send.ptr, recv.ptr, send.count, nccl_dtype(send.dtype), c, s);
  });
}

std::shared_ptr<sdk::Work> NcclCommunicator::reduce_scatter(const Buf& send, const Buf& recv, int32_t op,
                                                            const Opts& o) {
  cudaStream_t s = check_pair("reduce_scatter", send, recv);
  if (send.count != recv.count * static_cast<uint64_t>(world_size_))
    sdk::fail(DT_ERR_INVALID_USAGE, "nccl: reduce_scatter: send.count must be recv.count * world_size");
  auto red = nccl_op(op);
  return enqueue(describe("reduce_scatter", send, op), s, o, [&](ncclComm_t c) {
    return ncclReduceScatter(send.ptr, recv.ptr, recv.count, nccl_dtype(send.dtype), red, c, s);
  });
}

std::shared_ptr<sdk::Work> NcclCommunicator::reduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o) {
  if (o.root < 0 || o.root >= world_size_) sdk::fail(DT_ERR_INVALID_USAGE, "nccl: reduce: root out of range");
  // recv is used only on root; elsewhere NCCL gets send twice (in place, not written).
  bool root = rank_ == o.root;
  cudaStream_t s = static_cast<cudaStream_t>(send.stream);
  if (root)
    s = check_pair("reduce", send, recv);
  else
    check_buffer("reduce", send);
  if (root && send.count != recv.count) sdk::fail(DT_ERR_INVALID_USAGE, "nccl: reduce: send and recv counts differ");
  auto red = nccl_op(op);
  void* out = root ? recv.ptr : send.ptr;
  return enqueue(describe("reduce", send, op), s, o, [&](ncclComm_t c) {
    return ncclReduce(send.ptr, out, send.count, nccl_dtype(send.dtype), red, o.root, c, s);
  });
}

std::shared_ptr<sdk::Work> NcclCommunicator::alltoall(const Buf& send, const Buf& recv, const Opts& o) {
  cudaStream_t s = check_pair("alltoall", send, recv);
  if (send.count != recv.count || send.count % static_cast<uint64_t>(world_size_) != 0)
    sdk::fail(DT_ERR_INVALID_USAGE, "nccl: alltoall: send.count must equal recv.count and divide by world_size");
  size_t block = send.count / static_cast<uint64_t>(world_size_);
  size_t block_bytes = block * sdk::dtype_size(send.dtype);
  auto t = nccl_dtype(send.dtype);
  AlltoAllFn native = alltoall_;
  int n = world_size_;
  return enqueue(describe("alltoall", send), s, o, [&](ncclComm_t c) {
    if (native) return native(send.ptr, recv.ptr, block, t, c, s);
    ncclResult_t r = ncclGroupStart();
    for (int j = 0; j < n && r == ncclSuccess; ++j) {
      r = ncclSend(static_cast<const char*>(send.ptr) + j * block_bytes, block, t, j, c, s);
      if (r == ncclSuccess) r = ncclRecv(static_cast<char*>(recv.ptr) + j * block_bytes, block, t, j, c, s);
    }
    ncclResult_t end = ncclGroupEnd();
    return r == ncclSuccess ? end : r;
  });
}

std::shared_ptr<sdk::Work> NcclCommunicator::barrier(const Opts& o) {
  return enqueue("barrier", own_stream_, o, [&](ncclComm_t c) {
    return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, c, own_stream_);
  });
}

std::shared_ptr<sdk::Work> NcclCommunicator::post(const Buf& buf, int32_t peer, const Opts& o, bool is_send) {
  const char* op = is_send ? "send" : "recv";
  check_buffer(op, buf);
  if (peer < 0 || peer >= world_size_ || peer == rank_)
    sdk::fail(DT_ERR_INVALID_USAGE, std::string("nccl: ") + op + ": peer " + std::to_string(peer) +
                                        " is not another rank of 0.." + std::to_string(world_size_ - 1));
  if (state_->aborted()) sdk::fail(DT_ERR_ABORTED, std::string("nccl: ") + op + ": aborted: " + state_->abort_reason());
  std::string what = describe(op, buf) + (is_send ? " to rank " : " from rank ") + std::to_string(peer);
  auto w = std::make_shared<P2pWork>(p2p_, what);
  p2p_->add(is_send, buf, peer, static_cast<cudaStream_t>(buf.stream), sdk::deadline_after(o.timeout_ms, timeout_ms_),
            w);
  return w;
}

std::shared_ptr<sdk::Work> NcclCommunicator::send(const Buf& buf, int32_t peer, const Opts& o) {
  return post(buf, peer, o, true);
}

std::shared_ptr<sdk::Work> NcclCommunicator::recv(const Buf& buf, int32_t peer, const Opts& o) {
  return post(buf, peer, o, false);
}

}  // namespace dtrain::nccl_backend
