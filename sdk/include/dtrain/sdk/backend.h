#pragma once
// Write a backend as an ordinary C++ class; DTRAIN_EXPORT_BACKEND_V1 turns it
// into the C table of dtrain/abi/backend_v1.h, with trampolines that catch
// every exception and turn it into a status plus a last-error message.
//
//   class MyComm : public dtrain::sdk::Communicator {
//    public:
//     explicit MyComm(const dtrain::sdk::CommInit& init);
//     std::shared_ptr<dtrain::sdk::Work> allreduce(const dt_buffer_v1_t& send, const dt_buffer_v1_t& recv,
//                                                  int32_t op, const dt_call_opts_v1_t& o) override;
//     ...
//   };
//   static const dt_config_key_v1_t kKeys[] = {{"algorithm", "string", "\"ring\"", "..."}};
//   DTRAIN_EXPORT_BACKEND_V1(MyComm, "mine", "1.0.0", "what it is", DT_CAP_ALLREDUCE | DT_CAP_CPU_BUFFERS, kKeys)

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dtrain/sdk/op_queue.h"
#include "dtrain/sdk/support.h"
#include "dtrain/sdk/work.h"

namespace dtrain::sdk {

struct CommInit {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int role = DT_ROLE_WORKER;
  int64_t timeout_ms = 0;
  Store store;
  Options options;
  std::string job_id;
  // Every rank of the communicator runs on this host (a plugin then binds
  // its sockets to loopback unless told otherwise).
  bool single_host() const { return local_world_size >= world_size; }
};

// Runs a communicator's ops one at a time, in submission order, on one worker
// thread, so submission never blocks and ops overlap the caller's compute.
//
// With allow_inline = true, ops submitted with inline_ok run on the caller's
// thread when the caller waits for them at the head of an idle queue, which
// saves two thread hand-offs per op on the latency path. Such an op does not
// wake the worker at submission; the worker takes it when another op queues
// behind it, when test() polls it, or when a wait is too short to run it
// inline. inline_ok promises that the op's blocking transport calls end by
// themselves near its deadline (an abort cannot reach a caller blocked inside
// the transport), so a caller only runs it inline when it is prepared to wait
// that long anyway.
//
// abort() completes every queued and running op with DT_ERR_ABORTED at once.
// If an op is still blocked in the transport when the executor is destroyed
// after an abort, its thread is detached and finishes on its own (the op's
// body must then hold, by shared_ptr, everything it touches).
class SerialExecutor {
 public:
  using Clock = std::chrono::steady_clock;
  using Body = std::function<void(Clock::time_point deadline)>;

  explicit SerialExecutor(bool allow_inline = false) : s_(std::make_shared<State>()) {
    s_->allow_inline = allow_inline;
    thread_ = std::thread([s = s_] { loop(s); });
  }
  ~SerialExecutor() {
    bool detach;
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      s_->stop = true;
      detach = s_->aborted && s_->busy;
      s_->cv.notify_all();
    }
    if (detach) thread_.detach();
    else thread_.join();
  }

  std::shared_ptr<Work> submit(Body fn, Clock::time_point deadline, bool inline_ok = false) {
    auto w = std::make_shared<Task>(s_, std::move(fn), deadline, inline_ok && s_->allow_inline);
    std::lock_guard<std::mutex> lk(s_->mu);
    if (s_->aborted) {
      w->complete(DT_ERR_ABORTED, s_->abort_reason);
      return w;
    }
    bool lazy = w->inline_ok && s_->queue.empty() && !s_->busy;
    s_->queue.push_back(w);
    if (!lazy) s_->cv.notify_all();
    return w;
  }

  void abort(const std::string& reason) {
    std::deque<std::shared_ptr<Task>> q;
    std::shared_ptr<Task> running;
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      s_->aborted = true;
      s_->abort_reason = reason;
      q.swap(s_->queue);
      running = s_->running;
    }
    for (auto& t : q) t->complete(DT_ERR_ABORTED, reason);
    if (running) running->complete(DT_ERR_ABORTED, reason);
  }

 private:
  struct State;
  class Task : public Work {
   public:
    Task(std::shared_ptr<State> s, Body fn, Clock::time_point deadline, bool inline_ok)
        : deadline(deadline), inline_ok(inline_ok), s_(std::move(s)), fn_(std::move(fn)) {}
    dt_status_t test() override {
      dt_status_t st = Work::test();
      if (st == DT_IN_PROGRESS && inline_ok) kick(s_);
      return st;
    }
    dt_status_t wait(int64_t timeout_ms) override {
      if (inline_ok && Work::test() == DT_IN_PROGRESS) {
        bool long_enough = timeout_ms < 0 || Clock::now() + std::chrono::milliseconds(timeout_ms) +
                                                     std::chrono::milliseconds(100) >= deadline;
        if (!long_enough || !try_run_inline(s_, this)) kick(s_);
      }
      return Work::wait(timeout_ms);
    }
    void run() {
      try {
        fn_(deadline);
        complete(DT_OK);
      } catch (const Error& e) {
        complete(e.status(), e.what());
      } catch (const std::exception& e) {
        complete(DT_ERR_INTERNAL, e.what());
      } catch (...) {
        complete(DT_ERR_INTERNAL, "unknown exception");
      }
      fn_ = nullptr;
    }
    Clock::time_point deadline;
    const bool inline_ok;

   private:
    std::shared_ptr<State> s_;
    Body fn_;
  };

  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::shared_ptr<Task>> queue;
    std::shared_ptr<Task> running;
    bool busy = false;
    bool stop = false;
    bool aborted = false;
    bool allow_inline = false;
    std::string abort_reason;
  };

  static bool try_run_inline(const std::shared_ptr<State>& s, Task* t) {
    std::shared_ptr<Task> mine;
    {
      std::lock_guard<std::mutex> lk(s->mu);
      if (s->busy || s->queue.empty() || s->queue.front().get() != t) return false;
      mine = std::move(s->queue.front());
      s->queue.pop_front();
      s->busy = true;
      s->running = mine;
    }
    execute(s, mine);
    return true;
  }

  // Wakes the worker for an op that was queued without waking it.
  static void kick(const std::shared_ptr<State>& s) {
    std::lock_guard<std::mutex> lk(s->mu);
    if (!s->queue.empty()) s->cv.notify_all();
  }

  static void execute(const std::shared_ptr<State>& s, const std::shared_ptr<Task>& t) {
    t->run();
    std::lock_guard<std::mutex> lk(s->mu);
    s->running.reset();
    s->busy = false;
    // Waking an idle worker for nothing costs a context switch per inline op.
    if (!s->queue.empty()) s->cv.notify_all();
  }

  static void loop(std::shared_ptr<State> s) {
    for (;;) {
      std::shared_ptr<Task> t;
      {
        std::unique_lock<std::mutex> lk(s->mu);
        s->cv.wait(lk, [&] { return s->stop || (!s->busy && !s->queue.empty()); });
        if (s->stop) {
          for (auto& q : s->queue) q->complete(DT_ERR_ABORTED, "communicator destroyed");
          s->queue.clear();
          return;
        }
        t = std::move(s->queue.front());
        s->queue.pop_front();
        s->busy = true;
        s->running = t;
      }
      execute(s, t);
    }
  }

  std::shared_ptr<State> s_;
  std::thread thread_;
};

// Base class of a plugin's communicator. Ops left unimplemented refuse with
// DT_ERR_NOT_SUPPORTED (and should be left out of the capability bits).
class Communicator {
 public:
  virtual ~Communicator() = default;
  using Buf = dt_buffer_v1_t;
  using Opts = dt_call_opts_v1_t;
  virtual std::shared_ptr<Work> allreduce(const Buf&, const Buf&, int32_t, const Opts&) { return no("allreduce"); }
  virtual std::shared_ptr<Work> broadcast(const Buf&, const Opts&) { return no("broadcast"); }
  virtual std::shared_ptr<Work> allgather(const Buf&, const Buf&, const Opts&) { return no("allgather"); }
  virtual std::shared_ptr<Work> reduce_scatter(const Buf&, const Buf&, int32_t, const Opts&) {
    return no("reduce_scatter");
  }
  virtual std::shared_ptr<Work> reduce(const Buf&, const Buf&, int32_t, const Opts&) { return no("reduce"); }
  virtual std::shared_ptr<Work> alltoall(const Buf&, const Buf&, const Opts&) { return no("alltoall"); }
  virtual std::shared_ptr<Work> barrier(const Opts&) { return no("barrier"); }
  virtual std::shared_ptr<Work> send(const Buf&, int32_t, const Opts&) { return no("send"); }
  virtual std::shared_ptr<Work> recv(const Buf&, int32_t, const Opts&) { return no("recv"); }
  // Called from any thread (the core's watchdog); must not block on peers.
  virtual void abort(const std::string& reason) = 0;

 protected:
  static std::shared_ptr<Work> done() {
    auto w = std::make_shared<Work>();
    w->complete(DT_OK);
    return w;
  }

 private:
  [[noreturn]] static std::shared_ptr<Work> no(const char* op) {
    fail(DT_ERR_NOT_SUPPORTED, std::string("this backend does not implement ") + op);
  }
};

namespace detail {

struct CommHandle {
  std::unique_ptr<Communicator> comm;
  std::mutex mu;
  std::string last_error;
};
struct WorkHandle {
  std::shared_ptr<Work> work;
  std::string error;
};

inline std::string& tls_error() {
  thread_local std::string s;
  return s;
}

template <typename F>
dt_status_t guarded(std::string* err, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    if (err) *err = e.what();
    return e.status();
  } catch (const std::bad_alloc&) {
    if (err) *err = "out of memory";
    return DT_ERR_SYSTEM;
  } catch (const std::exception& e) {
    if (err) *err = e.what();
    return DT_ERR_INTERNAL;
  } catch (...) {
    if (err) *err = "unknown exception";
    return DT_ERR_INTERNAL;
  }
}

inline CommHandle* H(dt_comm_h c) { return reinterpret_cast<CommHandle*>(c); }
inline WorkHandle* W(dt_work_h w) { return reinterpret_cast<WorkHandle*>(w); }

template <typename F>
dt_status_t op(dt_comm_h c, dt_work_h* out, F&& f) {
  auto* h = H(c);
  std::string err;
  dt_status_t st = guarded(&err, [&] {
    std::shared_ptr<Work> w = f(*h->comm);
    if (!w) fail(DT_ERR_INTERNAL, "backend returned no work");
    *out = reinterpret_cast<dt_work_h>(new WorkHandle{std::move(w), {}});
    return DT_OK;
  });
  if (st != DT_OK) {
    std::lock_guard<std::mutex> lk(h->mu);
    h->last_error = err;
  }
  return st;
}

inline const dt_call_opts_v1_t& O(const dt_call_opts_v1_t* o) {
  static const dt_call_opts_v1_t empty{};
  return o ? *o : empty;
}

template <typename Comm>
struct Trampolines {
  static dt_status_t comm_create(const dt_comm_init_v1_t* in, dt_comm_h* out) {
    return guarded(&tls_error(), [&] {
      if (!in || !out) fail(DT_ERR_INVALID_USAGE, "comm_create: null argument");
      CommInit init;
      init.rank = in->rank;
      init.world_size = in->world_size;
      init.local_rank = in->local_rank;
      init.local_world_size = in->local_world_size;
      init.role = in->role;
      init.timeout_ms = in->timeout_ms;
      init.store = Store(in->store);
      init.options = Options(in->config_toml);
      init.job_id = in->job_id ? in->job_id : "";
      auto h = std::make_unique<CommHandle>();
      h->comm = std::make_unique<Comm>(init);
      *out = reinterpret_cast<dt_comm_h>(h.release());
      return DT_OK;
    });
  }
  static const char* backend_last_error() { return tls_error().c_str(); }
  static dt_status_t comm_destroy(dt_comm_h c) {
    return guarded(nullptr, [&] {
      delete H(c);
      return DT_OK;
    });
  }
  static dt_status_t comm_abort(dt_comm_h c, const char* reason) {
    return guarded(nullptr, [&] {
      H(c)->comm->abort(reason ? reason : "aborted");
      return DT_OK;
    });
  }
  static const char* comm_last_error(dt_comm_h c) {
    auto* h = H(c);
    std::lock_guard<std::mutex> lk(h->mu);
    tls_error() = h->last_error;
    return tls_error().c_str();
  }
  static dt_status_t allreduce(dt_comm_h c, const dt_buffer_v1_t* s, const dt_buffer_v1_t* r, int32_t o,
                               const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.allreduce(*s, *r, o, O(opts)); });
  }
  static dt_status_t broadcast(dt_comm_h c, const dt_buffer_v1_t* b, const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.broadcast(*b, O(opts)); });
  }
  static dt_status_t allgather(dt_comm_h c, const dt_buffer_v1_t* s, const dt_buffer_v1_t* r,
                               const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.allgather(*s, *r, O(opts)); });
  }
  static dt_status_t reduce_scatter(dt_comm_h c, const dt_buffer_v1_t* s, const dt_buffer_v1_t* r, int32_t o,
                                    const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.reduce_scatter(*s, *r, o, O(opts)); });
  }
  static dt_status_t reduce(dt_comm_h c, const dt_buffer_v1_t* s, const dt_buffer_v1_t* r, int32_t o,
                            const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.reduce(*s, *r, o, O(opts)); });
  }
  static dt_status_t alltoall(dt_comm_h c, const dt_buffer_v1_t* s, const dt_buffer_v1_t* r,
                              const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.alltoall(*s, *r, O(opts)); });
  }
  static dt_status_t barrier(dt_comm_h c, const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.barrier(O(opts)); });
  }
  static dt_status_t send(dt_comm_h c, const dt_buffer_v1_t* b, int32_t peer, const dt_call_opts_v1_t* opts,
                          dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.send(*b, peer, O(opts)); });
  }
  static dt_status_t recv(dt_comm_h c, const dt_buffer_v1_t* b, int32_t peer, const dt_call_opts_v1_t* opts,
                          dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.recv(*b, peer, O(opts)); });
  }
  static dt_status_t work_test(dt_work_h w) {
    return guarded(&W(w)->error, [&] { return W(w)->work->test(); });
  }
  static dt_status_t work_wait(dt_work_h w, int64_t timeout_ms) {
    return guarded(&W(w)->error, [&] { return W(w)->work->wait(timeout_ms); });
  }
  static const char* work_error(dt_work_h w) {
    auto* h = W(w);
    std::string e = h->work->error();
    if (!e.empty()) h->error = e;
    return h->error.c_str();
  }
  static void work_release(dt_work_h w) { delete W(w); }
};

template <typename Comm>
const dt_backend_v1_t* make_backend_v1(const dt_host_v1_t* host, const char* name, const char* version,
                                       const char* description, uint64_t caps, const dt_config_key_v1_t* keys,
                                       uint32_t nkeys) {
  Log::set_host(host);
  static const dt_backend_v1_t table = [&] {
    using T = Trampolines<Comm>;
    dt_backend_v1_t t{};
    t.abi_major = DT_BACKEND_V1_MAJOR;
    t.abi_minor = DT_BACKEND_V1_MINOR;
    t.struct_size = sizeof(dt_backend_v1_t);
    t.name = name;
    t.version = version;
    t.description = description;
    t.caps = caps;
    t.config_keys = keys;
    t.num_config_keys = nkeys;
    t.comm_create = T::comm_create;
    t.backend_last_error = T::backend_last_error;
    t.comm_destroy = T::comm_destroy;
    t.comm_abort = T::comm_abort;
    t.comm_last_error = T::comm_last_error;
    t.allreduce = T::allreduce;
    t.broadcast = T::broadcast;
    t.allgather = T::allgather;
    t.reduce_scatter = T::reduce_scatter;
    t.reduce = T::reduce;
    t.alltoall = T::alltoall;
    t.barrier = T::barrier;
    t.send = T::send;
    t.recv = T::recv;
    t.work_test = T::work_test;
    t.work_wait = T::work_wait;
    t.work_error = T::work_error;
    t.work_release = T::work_release;
    return t;
  }();
  return &table;
}

}  // namespace detail
}  // namespace dtrain::sdk

#define DTRAIN_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

// Exports dtrain_backend_v1 for CommClass. KEYS is a dt_config_key_v1_t array
// (its size is taken with sizeof), or use DTRAIN_EXPORT_BACKEND_V1_NOKEYS.
#define DTRAIN_EXPORT_BACKEND_V1(CommClass, NAME, VERSION, DESCRIPTION, CAPS, KEYS)                          \
  DTRAIN_PLUGIN_EXPORT const dt_backend_v1_t* dtrain_backend_v1(const dt_host_v1_t* host) {                 \
    return ::dtrain::sdk::detail::make_backend_v1<CommClass>(host, NAME, VERSION, DESCRIPTION, CAPS, KEYS,   \
                                                             static_cast<uint32_t>(sizeof(KEYS) / sizeof((KEYS)[0]))); \
  }
#define DTRAIN_EXPORT_BACKEND_V1_NOKEYS(CommClass, NAME, VERSION, DESCRIPTION, CAPS)                           \
  DTRAIN_PLUGIN_EXPORT const dt_backend_v1_t* dtrain_backend_v1(const dt_host_v1_t* host) {                   \
    return ::dtrain::sdk::detail::make_backend_v1<CommClass>(host, NAME, VERSION, DESCRIPTION, CAPS, nullptr, 0); \
  }
