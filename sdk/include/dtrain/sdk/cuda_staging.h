#pragma once
// CUDA buffers on a host transport, as c10d's Gloo takes them: each op copies
// its CUDA inputs to pinned host memory (ordered on the buffer's stream), runs
// the backend's own host op on the copies, copies the results back on the
// same stream, and its work completes only after that copy has. One line in a
// CPU plugin gives it CUDA buffers:
//
//   DTRAIN_EXPORT_BACKEND_V1_TABLE(dtrain::sdk::CudaStaged<MyComm>, "mine", ...,
//                                  kCaps | DT_CAP_CUDA_BUFFERS, my_keys())
//
// The CUDA runtime is loaded at run time (cuda_runtime.h): the plugin loads
// and runs CPU ops on machines without CUDA, where an op on a CUDA buffer
// fails at once ("buffer on cuda:0 but no CUDA device is visible: ...") and
// the communicator stays usable. Ops whose buffers are all in host memory go
// straight to MyComm, untouched.
//
// Contract:
// - The submitting thread waits until the buffer's stream has reached the op
//   (the copy to host has landed): the host transport reads the copy as soon
//   as the op runs. Work queued on the stream after the submission is not
//   waited for beyond that point.
// - When the work reports completion (test() or wait() returning DT_OK), the
//   results are in the CUDA buffers; until then the caller leaves them alone.
//   The copy back is started by whoever tests or waits first (the core's
//   watchdog tests every work, so a dropped work still copies back).
// - Pinned buffers come from a pool per communicator (reused, never
//   allocated per op once warm); CUDA events likewise.
// Header-only, standard C++17.

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/sdk/backend.h"
#include "dtrain/sdk/cuda_runtime.h"
#include "dtrain/sdk/error.h"
#include "dtrain/sdk/work.h"

namespace dtrain::sdk {

// Pinned host blocks and CUDA events, reused across the ops of one
// communicator. Thread-safe. Blocks hold the pool alive.
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  static constexpr size_t kMinBlock = 64 << 10;
  static constexpr size_t kMaxIdle = 16;  // idle blocks kept; more are freed (smallest first)

  struct Block {
    void* ptr = nullptr;
    size_t bytes = 0;
  };

  ~PinnedPool() {
    const auto& rt = cuda::runtime();
    for (auto& b : idle_) rt.FreeHost(b.ptr);  // at exit the runtime may be gone: nothing to report to
    for (auto& e : events_) rt.EventDestroy(e.second);
  }

  // A block of at least bytes (power-of-two classes from 64 KiB).
  Block acquire(size_t bytes) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto best = idle_.end();
      for (auto it = idle_.begin(); it != idle_.end(); ++it)
        if (it->bytes >= bytes && (best == idle_.end() || it->bytes < best->bytes)) best = it;
      if (best != idle_.end()) {
        Block b = *best;
        idle_.erase(best);
        return b;
      }
    }
    size_t cap = kMinBlock;
    while (cap < bytes) cap <<= 1;
    Block b{nullptr, cap};
    const auto& rt = cuda::runtime();
    rt.check(rt.HostAlloc(&b.ptr, cap, cuda::kHostAllocPortable),
             "cudaHostAlloc of " + std::to_string(cap) + " bytes of pinned staging memory");
    return b;
  }
  void release(Block b) {
    std::lock_guard<std::mutex> lk(mu_);
    idle_.push_back(b);
    if (idle_.size() > kMaxIdle) {
      auto smallest = std::min_element(idle_.begin(), idle_.end(),
                                       [](const Block& x, const Block& y) { return x.bytes < y.bytes; });
      cuda::runtime().FreeHost(smallest->ptr);
      idle_.erase(smallest);
    }
  }
  // An event of device (made current by the caller); events belong to a device.
  void* event(int device) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto it = events_.begin(); it != events_.end(); ++it)
        if (it->first == device) {
          void* e = it->second;
          events_.erase(it);
          return e;
        }
    }
    void* e = nullptr;
    const auto& rt = cuda::runtime();
    rt.check(rt.EventCreateWithFlags(&e, cuda::kEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void release_event(int device, void* e) {
    std::lock_guard<std::mutex> lk(mu_);
    events_.emplace_back(device, e);
  }

 private:
  std::mutex mu_;
  std::vector<Block> idle_;
  std::vector<std::pair<int, void*>> events_;
};

namespace detail {

// One CUDA buffer of an op and its pinned copy.
struct StagedBuffer {
  dt_buffer_v1_t device{};
  PinnedPool::Block block;
  bool copy_back = false;
};

}  // namespace detail

// The work of a staged op: the backend's host work, then the copies back.
class StagedWork : public Work {
 public:
  StagedWork(std::shared_ptr<Work> inner, std::shared_ptr<PinnedPool> pool, std::vector<detail::StagedBuffer> bufs)
      : inner_(std::move(inner)), pool_(std::move(pool)), bufs_(std::move(bufs)) {}
  ~StagedWork() override {
    std::lock_guard<std::mutex> lk(stage_mu_);
    if (phase_ == Phase::Copying && cuda::runtime().EventSynchronize(event_) == cuda::kSuccess) phase_ = Phase::Done;
    if (phase_ == Phase::Done) give_back();
    // Else the host op failed or never finished: the transport may still
    // touch the pinned copies, so they are not reused (a failed op poisons
    // the communicator; nothing more is staged on it).
  }

  dt_status_t test() override { return step(false, 0); }
  dt_status_t wait(int64_t timeout_ms) override { return step(true, timeout_ms); }

 private:
  enum class Phase { Host, Copying, Done, Failed };

  // No lock is held while waiting (the host op, the copy back): the core's
  // watchdog tests the work from another thread meanwhile.
  dt_status_t step(bool block, int64_t timeout_ms) {
    std::unique_lock<std::mutex> lk(stage_mu_);
    if (phase_ == Phase::Host) {
      lk.unlock();
      dt_status_t st = block ? inner_->wait(timeout_ms) : inner_->test();
      if (st == DT_IN_PROGRESS) return st;
      lk.lock();
      if (phase_ == Phase::Host) {
        if (st != DT_OK) {
          phase_ = Phase::Failed;
          complete(st, inner_->error());
        } else {
          try {
            start_copy_back();
          } catch (const Error& e) {
            phase_ = Phase::Failed;
            complete(e.status(), e.what());
          }
        }
      }
    }
    if (phase_ == Phase::Copying) {
      const auto& rt = cuda::runtime();
      void* ev = event_;
      int st;
      if (block) {
        lk.unlock();
        st = rt.EventSynchronize(ev);
        lk.lock();
      } else {
        st = rt.EventQuery(ev);
      }
      if (phase_ == Phase::Copying) {
        if (st == cuda::kErrorNotReady) return DT_IN_PROGRESS;
        if (st != cuda::kSuccess) {
          rt.GetLastError();
          phase_ = Phase::Failed;
          complete(DT_ERR_SYSTEM, "CUDA: copying the result back to cuda:" + std::to_string(event_device_) +
                                      " failed: " + rt.describe(st));
        } else {
          phase_ = Phase::Done;
          give_back();
          complete(DT_OK);
        }
      }
    }
    return Work::test();
  }

  void start_copy_back() {
    const auto& rt = cuda::runtime();
    const detail::StagedBuffer* last = nullptr;
    for (auto& b : bufs_) {
      if (!b.copy_back) continue;
      cuda::DeviceGuard g(rt, b.device.device_id);
      rt.check(
          rt.MemcpyAsync(b.device.ptr, b.block.ptr, bytes_of(b.device), cuda::kMemcpyHostToDevice, b.device.stream),
          "cudaMemcpyAsync of the result to cuda:" + std::to_string(b.device.device_id));
      last = &b;
    }
    if (!last) {
      phase_ = Phase::Done;
      give_back();
      complete(DT_OK);
      return;
    }
    // Buffers of one op share a stream in practice; the event on the last
    // copy's stream covers the ones before it on that stream.
    for (auto& b : bufs_)
      if (b.copy_back && (b.device.stream != last->device.stream || b.device.device_id != last->device.device_id)) {
        cuda::DeviceGuard g(rt, b.device.device_id);
        rt.check(rt.StreamSynchronize(b.device.stream), "cudaStreamSynchronize");
      }
    cuda::DeviceGuard g(rt, last->device.device_id);
    event_device_ = last->device.device_id;
    event_ = pool_->event(event_device_);
    rt.check(rt.EventRecord(event_, last->device.stream), "cudaEventRecord");
    phase_ = Phase::Copying;
  }

  void give_back() {
    for (auto& b : bufs_)
      if (b.block.ptr) pool_->release(b.block);
    bufs_.clear();
    if (event_) pool_->release_event(event_device_, event_);
    event_ = nullptr;
  }

  std::shared_ptr<Work> inner_;
  std::shared_ptr<PinnedPool> pool_;
  std::vector<detail::StagedBuffer> bufs_;
  std::mutex stage_mu_;
  Phase phase_ = Phase::Host;
  void* event_ = nullptr;
  int event_device_ = 0;
};

// The staging of one op's buffers. in(): the backend reads it (copied to
// host now); out(): the backend writes it (copied back when the host op is
// done); both for in-place buffers. A buffer already staged (in-place
// send == recv) is staged once. Host buffers pass through unchanged.
class Staging {
 public:
  explicit Staging(std::shared_ptr<PinnedPool> pool) : pool_(std::move(pool)) {}
  ~Staging() {
    for (auto& b : bufs_)
      if (b.block.ptr) pool_->release(b.block);
  }

  static bool any_cuda(std::initializer_list<const dt_buffer_v1_t*> bufs) {
    for (auto* b : bufs)
      if (b && b->device_type == DT_DEVICE_CUDA) return true;
    return false;
  }

  dt_buffer_v1_t stage(const dt_buffer_v1_t& b, bool in, bool out) {
    if (b.device_type == DT_DEVICE_CPU) return b;
    if (b.device_type != DT_DEVICE_CUDA)
      fail(DT_ERR_NOT_SUPPORTED, "device type " + std::to_string(b.device_type) + " is neither CPU nor CUDA");
    const auto& rt = cuda::require_device(b.device_id);
    dt_buffer_v1_t host = b;
    host.device_type = DT_DEVICE_CPU;
    host.device_id = 0;
    host.stream = nullptr;
    size_t bytes = bytes_of(b);
    if (bytes == 0) return host;  // nothing to move; the op still takes part
    for (auto& s : bufs_)
      if (s.device.ptr == b.ptr && s.device.device_id == b.device_id) {
        s.copy_back = s.copy_back || out;
        host.ptr = s.block.ptr;
        return host;
      }
    detail::StagedBuffer s;
    s.device = b;
    s.copy_back = out;
    s.block = pool_->acquire(bytes);
    bufs_.push_back(s);
    host.ptr = s.block.ptr;
    if (in) {
      cuda::DeviceGuard g(rt, b.device_id);
      rt.check(rt.MemcpyAsync(s.block.ptr, b.ptr, bytes, cuda::kMemcpyDeviceToHost, b.stream),
               "cudaMemcpyAsync of cuda:" + std::to_string(b.device_id) + " to pinned host memory");
      rt.check(rt.StreamSynchronize(b.stream), "cudaStreamSynchronize on cuda:" + std::to_string(b.device_id));
    }
    return host;
  }

  // Hands the staged buffers to the work of the host op.
  std::shared_ptr<Work> finish(std::shared_ptr<Work> inner) {
    if (bufs_.empty()) return inner;
    auto w = std::make_shared<StagedWork>(std::move(inner), pool_, std::move(bufs_));
    bufs_.clear();
    return w;
  }

 private:
  std::shared_ptr<PinnedPool> pool_;
  std::vector<detail::StagedBuffer> bufs_;
};

// Comm (an sdk::Communicator on host memory) with CUDA buffers staged
// through pinned host memory; see the top of this file.
template <typename Comm>
class CudaStaged : public Comm {
 public:
  using Buf = dt_buffer_v1_t;
  using Opts = dt_call_opts_v1_t;
  explicit CudaStaged(const CommInit& init) : Comm(init), rank_(init.rank) {}

  // The copy back to the device completes with the host op's work, so a
  // staged op never runs inside its call (DT_CALL_WAIT is dropped for it).
  static Opts queued(Opts o) {
    o.flags &= ~DT_CALL_WAIT;
    return o;
  }

  // op(send, recv, opts) on host copies where either buffer is on a device:
  // send copied in, recv copied back after the op when copy_back.
  template <typename Op>
  std::shared_ptr<Work> staged_pair(const Buf& s, const Buf& r, const Opts& o, bool copy_back, Op op) {
    if (!Staging::any_cuda({&s, &r})) return op(s, r, o);
    Staging st(pool());
    auto hs = st.stage(s, true, false);
    auto hr = st.stage(r, false, copy_back);
    return st.finish(op(hs, hr, queued(o)));
  }

  std::shared_ptr<Work> allreduce(const Buf& s, const Buf& r, int32_t op, const Opts& o) override {
    return staged_pair(s, r, o, true,
                       [&](const Buf& a, const Buf& b, const Opts& x) { return Comm::allreduce(a, b, op, x); });
  }
  std::shared_ptr<Work> broadcast(const Buf& b, const Opts& o) override {
    if (!Staging::any_cuda({&b})) return Comm::broadcast(b, o);
    Staging st(pool());
    bool root = o.root == rank_;
    auto hb = st.stage(b, root, !root);
    return st.finish(Comm::broadcast(hb, queued(o)));
  }
  std::shared_ptr<Work> allgather(const Buf& s, const Buf& r, const Opts& o) override {
    return staged_pair(s, r, o, true,
                       [&](const Buf& a, const Buf& b, const Opts& x) { return Comm::allgather(a, b, x); });
  }
  std::shared_ptr<Work> reduce_scatter(const Buf& s, const Buf& r, int32_t op, const Opts& o) override {
    return staged_pair(s, r, o, true,
                       [&](const Buf& a, const Buf& b, const Opts& x) { return Comm::reduce_scatter(a, b, op, x); });
  }
  std::shared_ptr<Work> reduce(const Buf& s, const Buf& r, int32_t op, const Opts& o) override {
    return staged_pair(s, r, o, o.root == rank_,
                       [&](const Buf& a, const Buf& b, const Opts& x) { return Comm::reduce(a, b, op, x); });
  }
  std::shared_ptr<Work> alltoall(const Buf& s, const Buf& r, const Opts& o) override {
    return staged_pair(s, r, o, true,
                       [&](const Buf& a, const Buf& b, const Opts& x) { return Comm::alltoall(a, b, x); });
  }
  std::shared_ptr<Work> send(const Buf& b, int32_t peer, const Opts& o) override {
    if (!Staging::any_cuda({&b})) return Comm::send(b, peer, o);
    Staging st(pool());
    auto hb = st.stage(b, true, false);
    return st.finish(Comm::send(hb, peer, o));
  }
  std::shared_ptr<Work> recv(const Buf& b, int32_t peer, const Opts& o) override {
    if (!Staging::any_cuda({&b})) return Comm::recv(b, peer, o);
    Staging st(pool());
    auto hb = st.stage(b, false, true);
    return st.finish(Comm::recv(hb, peer, o));
  }

 private:
  std::shared_ptr<PinnedPool> pool() {
    std::lock_guard<std::mutex> lk(pool_mu_);
    if (!pool_) pool_ = std::make_shared<PinnedPool>();
    return pool_;
  }
  int rank_;
  std::mutex pool_mu_;
  std::shared_ptr<PinnedPool> pool_;
};

}  // namespace dtrain::sdk
