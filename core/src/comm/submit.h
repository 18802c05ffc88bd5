#pragma once
// How an op reaches the plugin: argument helpers and the one submission path
// (poison check, capability check, WorkState with its deadline, tracking)
// shared by Communicator's collectives and the parameter-server client.

#include <limits>
#include <memory>
#include <string>

#include "comm/comm_state.h"
#include "dtrain/work.h"
#include "plugin/backend_impl.h"

namespace dtrain::detail {

struct OpDesc {
  const char* name;
  uint64_t cap;
  bool collective;
  bool unbounded = false;  // a negative CallOptions timeout means no deadline (ps_serve)
};

inline void check_buffer(const CommState& s, const Buffer& b, const char* role, const char* op) {
  int t = static_cast<int>(b.dtype);
  if (t < 0 || t >= kNumDTypes)
    throw InvalidUsage(std::string(op) + ": " + role + " buffer has an unknown dtype code " + std::to_string(t));
  if (b.count > 0 && !b.ptr)
    throw InvalidUsage(std::string(op) + ": " + role + " buffer is null with count " + std::to_string(b.count));
  // As c10d: "backend X does not support CUDA buffers (allreduce: send buffer on cuda:0)".
  bool cuda = b.device.type == DeviceType::CUDA;
  if (!s.supports(cuda ? DT_CAP_CUDA_BUFFERS : DT_CAP_CPU_BUFFERS))
    throw NotSupported("backend '" + s.backend->name() + "' does not support " + (cuda ? "CUDA" : "CPU") +
                       " buffers (" + op + ": " + (*role ? std::string(role) + " buffer" : std::string("buffer")) +
                       " on " + b.device.str() + ")");
}

inline dt_buffer_v1_t to_abi(const Buffer& b) {
  dt_buffer_v1_t r{};
  r.ptr = b.ptr;
  r.count = b.count;
  r.dtype = static_cast<int32_t>(b.dtype);
  r.device_type = static_cast<int32_t>(b.device.type);
  r.device_id = b.device.index;
  r.stream = b.stream;
  return r;
}

// Fills the parts of a work that describe it (op_name, label, dtype...).
struct NoPrepare {
  void operator()(WorkState&) const {}
};

struct WorkAccess {
  static const std::shared_ptr<WorkState>& state(const Work& w) { return w.state_; }
};

// A blocking collective's work for reuse, when the spare one is free: only
// the spare holds the Work and only the Work its state (the watchdog and
// every waiter let go). Null otherwise. The state is reset for a new op.
#if defined(__SANITIZE_THREAD__)
#define DTRAIN_NO_SPARE_WORK 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DTRAIN_NO_SPARE_WORK 1
#endif
#endif
inline std::shared_ptr<Work> take_spare(SpareWork* spare) {
#ifdef DTRAIN_NO_SPARE_WORK
  // ThreadSanitizer does not model the fence below (GCC refuses to compile
  // it there): under it every blocking op gets a new Work.
  (void)spare;
  return nullptr;
#else
  if (!spare || spare->taken.exchange(true, std::memory_order_acquire)) return nullptr;
  std::shared_ptr<Work> w = std::move(spare->work);
  spare->taken.store(false, std::memory_order_release);
  if (!w || w.use_count() != 1 || WorkAccess::state(*w).use_count() != 1) return nullptr;
  // Pairs with the release of the last other reference: its reads are done.
  std::atomic_thread_fence(std::memory_order_acquire);
  WorkState& st = *WorkAccess::state(*w);
  st.dtype = -1;
  st.count = 0;
  st.claimed.store(false, std::memory_order_relaxed);
  st.done.store(false, std::memory_order_relaxed);
  return w;
#endif
}

inline void keep_spare(SpareWork* spare, const std::shared_ptr<Work>& w) {
  if (!spare || spare->taken.exchange(true, std::memory_order_acquire)) return;
  spare->work = w;
  spare->taken.store(false, std::memory_order_release);
}

// o.timeout: the op's deadline from now; zero (or negative) uses the
// communicator's default; negative means none for an unbounded op.
// spare: the communicator's reusable work for blocking collectives.
template <typename Submit, typename Prepare = NoPrepare>
std::shared_ptr<Work> submit(const std::shared_ptr<CommState>& s, const OpDesc& d, const Buffer* b, const char* op,
                             int peer, CallOptions o, Submit&& call, Prepare&& prepare = {},
                             SpareWork* spare = nullptr) {
  if (s->poisoned.load())
    throw InvalidUsage("communicator '" + s->name + "' (backend '" + s->backend->name() +
                       "') is aborted and refuses new work: " + s->reason());
  if (!s->supports(d.cap))
    throw NotSupported("backend '" + s->backend->name() + "' does not support " + d.name +
                       " (it supports: " + s->backend->info().caps_string() + ")");
  // A blocking collective may run inside the call (DT_CALL_WAIT).
  bool inline_ok = o.blocking && d.collective && s->call_wait;
  std::shared_ptr<Work> reused = inline_ok ? take_spare(spare) : nullptr;
  std::shared_ptr<WorkState> w = reused ? WorkAccess::state(*reused) : std::make_shared<WorkState>();
  if (!reused) w->comm = s;
  w->seq = d.collective ? s->coll_seq.fetch_add(1, std::memory_order_relaxed) + 1 : 0;
  w->peer = peer;
  w->op_name = d.name;
  w->op_detail = op;
  w->collective = d.collective;
  if (b) {
    w->dtype = static_cast<int32_t>(b->dtype);
    w->count = b->count;
  }
  prepare(*w);
  w->submitted = coarse_now();
  auto timeout = o.timeout.count() > 0 ? o.timeout : s->timeout;
  if (o.timeout.count() < 0 && d.unbounded) timeout = o.timeout;
  dt_call_opts_v1_t opts{};
  opts.struct_size = sizeof(opts);
  if (timeout.count() < 0) {
    w->deadline_ns.store(std::numeric_limits<int64_t>::max(), std::memory_order_relaxed);  // not shared yet
    opts.timeout_ms = -1;
  } else {
    w->deadline_ns.store((w->submitted + timeout).time_since_epoch().count(), std::memory_order_relaxed);
    opts.timeout_ms = timeout.count();
  }
  // Tracked first when it may run inside the call, so the watchdog sees (and
  // can expire) it while it runs.
  if (inline_ok) {
    opts.flags |= DT_CALL_WAIT;
    s->track(w);
  }
  dt_work_h h = nullptr;
  dt_status_t st = call(opts, &h);
  if (st != DT_OK || (!h && !inline_ok)) {
    if (inline_ok) s->untrack(w.get());
    const char* e = s->table->comm_last_error(s->handle);
    std::string msg = w->what() + " was refused: " + (e && *e ? e : "no reason given");
    std::rethrow_exception(make_backend_error(s->backend->name(), st == DT_OK ? DT_ERR_INTERNAL : st, msg));
  }
  if (!h) {
    // It ran and succeeded in the call, unless the watchdog failed it first.
    w->finish(nullptr);
    if (w->error) std::rethrow_exception(w->error);
    if (!reused) reused = std::make_shared<Work>(std::move(w));
    keep_spare(spare, reused);
    return reused;
  }
  w->handle.store(h, std::memory_order_release);
  if (!inline_ok) s->track(w);
  auto work = reused ? std::move(reused) : std::make_shared<Work>(std::move(w));
  if (o.blocking) work->wait();
  return work;
}

}  // namespace dtrain::detail
