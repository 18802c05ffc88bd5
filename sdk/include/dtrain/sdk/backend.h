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
//     // A collective may return null when DT_CALL_WAIT is in o.flags and it
//     // already ran to success (OpQueue::run_or_submit does that).
//     ...
//   };
//   // The keys, each declared once (config_table.h): a field with its default, one line with name, bound, doc.
//   struct MyKeys { std::string algorithm = "ring"; int64_t depth = 4; };
//   const dtrain::sdk::ConfigTable<MyKeys>& my_keys() {
//     static const dtrain::sdk::ConfigTable<MyKeys> t("mine", {
//         {"algorithm", &MyKeys::algorithm, "ring or tree"},
//         {"depth", &MyKeys::depth, dtrain::sdk::in_range(1, 64), "chunks in flight"}});
//     return t;
//   }
//   DTRAIN_EXPORT_BACKEND_V1_TABLE(MyComm, "mine", "1.0.0", "what it is", DT_CAP_ALLREDUCE | DT_CAP_CPU_BUFFERS,
//                                  my_keys())
//
//   // in MyComm's constructor: the values set in the job file, else the defaults, bounds checked
//   MyKeys k = my_keys().read(init.options);
//
// The rest of the SDK, all header-only: op_queue.h (the in-order op queue
// collectives run on, inline on the waiting thread), p2p.h (posted
// point-to-point works and their completion), clock.h (the deadline rule),
// reduce.h and half.h (reduction kernels, f16/bf16), support.h (the host's
// logger and store, the plugin's options), config_table.h (the plugin's keys).

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dtrain/sdk/config_table.h"
#include "dtrain/sdk/op_queue.h"
#include "dtrain/sdk/p2p.h"
#include "dtrain/sdk/ps_table_fields.h"
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
  std::string job_token;  // "" when the job has none
  int num_servers = 0;    // PS communicators only
  int num_workers = 0;
  bool is_server() const { return role == DT_ROLE_SERVER; }
  // Every rank of the communicator runs on this host (a plugin then binds
  // its sockets to loopback unless told otherwise).
  bool single_host() const { return local_world_size >= world_size; }
};

// A parameter-server table descriptor, copied out of dt_ps_table_desc_v1_t
// (fields past the caller's struct_size keep their defaults). Its fields and
// their defaults are those of DTRAIN_PS_TABLE_FIELDS (ps_table_fields.h).
struct TableDesc {
  std::string name;
#define DTRAIN_SDK_FIELD(field, type, def, ...) type field = def;
  DTRAIN_PS_TABLE_FIELDS(DTRAIN_SDK_FIELD)
#undef DTRAIN_SDK_FIELD

  static TableDesc from_c(const dt_ps_table_desc_v1_t& c) {
    TableDesc d;
    auto has = [&](size_t end) { return c.struct_size >= end; };
    if (has(offsetof(dt_ps_table_desc_v1_t, name) + sizeof(c.name)) && c.name) d.name = c.name;
#define DTRAIN_SDK_TAKE(field, ...) \
  if (has(offsetof(dt_ps_table_desc_v1_t, field) + sizeof(c.field))) d.field = c.field;
    DTRAIN_PS_TABLE_FIELDS(DTRAIN_SDK_TAKE)
#undef DTRAIN_SDK_TAKE
    return d;
  }
};

// Base class of a plugin's communicator. Ops left unimplemented refuse with
// DT_ERR_NOT_SUPPORTED (and should be left out of the capability bits).
class Communicator {
 public:
  virtual ~Communicator() = default;
  using Buf = dt_buffer_v1_t;
  using Opts = dt_call_opts_v1_t;
  virtual std::shared_ptr<Work> allreduce(const Buf&, const Buf&, int32_t, const Opts&) {
    return not_supported("allreduce");
  }
  virtual std::shared_ptr<Work> broadcast(const Buf&, const Opts&) { return not_supported("broadcast"); }
  virtual std::shared_ptr<Work> allgather(const Buf&, const Buf&, const Opts&) { return not_supported("allgather"); }
  virtual std::shared_ptr<Work> reduce_scatter(const Buf&, const Buf&, int32_t, const Opts&) {
    return not_supported("reduce_scatter");
  }
  virtual std::shared_ptr<Work> reduce(const Buf&, const Buf&, int32_t, const Opts&) { return not_supported("reduce"); }
  virtual std::shared_ptr<Work> alltoall(const Buf&, const Buf&, const Opts&) { return not_supported("alltoall"); }
  virtual std::shared_ptr<Work> barrier(const Opts&) { return not_supported("barrier"); }
  virtual std::shared_ptr<Work> send(const Buf&, int32_t, const Opts&) { return not_supported("send"); }
  virtual std::shared_ptr<Work> recv(const Buf&, int32_t, const Opts&) { return not_supported("recv"); }
  // Parameter-server half (ABI minor 1): see dt_backend_v1_t for each
  // contract. The work's buffers and keys stay valid until it completes.
  virtual std::shared_ptr<Work> ps_table(const TableDesc&, uint32_t* /*table*/, const Opts&) {
    return not_supported("ps_table");
  }
  virtual std::shared_ptr<Work> ps_pull_dense(uint32_t, const Buf&, const Opts&) {
    return not_supported("ps_pull_dense");
  }
  virtual std::shared_ptr<Work> ps_push_dense(uint32_t, const Buf&, const Opts&) {
    return not_supported("ps_push_dense");
  }
  virtual std::shared_ptr<Work> ps_pull_sparse(uint32_t, const uint64_t*, uint64_t, const Buf&, const Opts&) {
    return not_supported("ps_pull_sparse");
  }
  virtual std::shared_ptr<Work> ps_push_sparse(uint32_t, const uint64_t*, uint64_t, const Buf&,
                                               const float* /*show_click*/, const Opts&) {
    return not_supported("ps_push_sparse");
  }
  virtual std::shared_ptr<Work> ps_save(uint32_t, const std::string& /*dir*/, int32_t /*mode*/, int32_t /*format*/,
                                        const Opts&) {
    return not_supported("ps_save");
  }
  virtual std::shared_ptr<Work> ps_load(uint32_t, const std::string& /*dir*/, const Opts&) {
    return not_supported("ps_load");
  }
  virtual std::shared_ptr<Work> ps_shrink(uint32_t, uint32_t /*flags*/, const Opts&) {
    return not_supported("ps_shrink");
  }
  virtual std::shared_ptr<Work> ps_barrier(const Opts&) { return not_supported("ps_barrier"); }
  virtual std::shared_ptr<Work> ps_finish(const Opts&) { return not_supported("ps_finish"); }
  virtual std::shared_ptr<Work> ps_serve(const Opts&) { return not_supported("ps_serve"); }
  // Any thread; must not block.
  virtual void ps_stop(const std::string& /*reason*/) {}

  // Called from any thread (the core's watchdog); must not block on peers.
  virtual void abort(const std::string& reason) = 0;

 protected:
  static std::shared_ptr<Work> done() {
    auto w = std::make_shared<Work>();
    w->complete(DT_OK);
    return w;
  }

 private:
  [[noreturn]] static std::shared_ptr<Work> not_supported(const char* op) {
    fail(DT_ERR_NOT_SUPPORTED, std::string("this backend does not implement ") + op);
  }
};

// Declares, inside a Communicator subclass, the overrides of every collective
// and point-to-point op, for a transport that implements them all (gloo, ucx,
// nccl). The definitions are the plugin's.
#define DTRAIN_SDK_COMMUNICATOR_OPS                                                                                  \
  std::shared_ptr<::dtrain::sdk::Work> allreduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o)        \
      override;                                                                                                      \
  std::shared_ptr<::dtrain::sdk::Work> broadcast(const Buf& buf, const Opts& o) override;                            \
  std::shared_ptr<::dtrain::sdk::Work> allgather(const Buf& send, const Buf& recv, const Opts& o) override;          \
  std::shared_ptr<::dtrain::sdk::Work> reduce_scatter(const Buf& send, const Buf& recv, int32_t op, const Opts& o)   \
      override;                                                                                                      \
  std::shared_ptr<::dtrain::sdk::Work> reduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o) override; \
  std::shared_ptr<::dtrain::sdk::Work> alltoall(const Buf& send, const Buf& recv, const Opts& o) override;           \
  std::shared_ptr<::dtrain::sdk::Work> barrier(const Opts& o) override;                                              \
  std::shared_ptr<::dtrain::sdk::Work> send(const Buf& buf, int32_t peer, const Opts& o) override;                   \
  std::shared_ptr<::dtrain::sdk::Work> recv(const Buf& buf, int32_t peer, const Opts& o) override;                   \
  void abort(const std::string& reason) override

namespace detail {

struct CommHandle {
  std::unique_ptr<Communicator> comm;
  std::mutex mu;
  std::string last_error;
};
// What a dt_work_h points to. A work handed out for the first time is its
// own handle (no allocation per op): the handle is the Work, holding itself
// through abi_self_. A work a plugin hands out again while an earlier handle
// to it is alive gets a separate handle of this type.
struct WorkHandle {
  std::shared_ptr<Work> work;
  std::string error;

  static dt_work_h make(std::shared_ptr<Work> w) {
    Work* p = w.get();
    if (!p->abi_claimed_.exchange(true, std::memory_order_acq_rel)) {
      p->abi_self_ = std::move(w);
      return reinterpret_cast<dt_work_h>(reinterpret_cast<uintptr_t>(p) | 1);
    }
    return reinterpret_cast<dt_work_h>(new WorkHandle{std::move(w), {}});
  }
  static bool embedded(dt_work_h h) { return reinterpret_cast<uintptr_t>(h) & 1; }
  static Work* work_of(dt_work_h h) {
    if (embedded(h)) return reinterpret_cast<Work*>(reinterpret_cast<uintptr_t>(h) & ~uintptr_t{1});
    return reinterpret_cast<WorkHandle*>(h)->work.get();
  }
  static std::string& error_of(dt_work_h h) {
    if (embedded(h)) return work_of(h)->abi_error_;
    return reinterpret_cast<WorkHandle*>(h)->error;
  }
  static void release(dt_work_h h) {
    if (!embedded(h)) {
      delete reinterpret_cast<WorkHandle*>(h);
      return;
    }
    Work* p = work_of(h);
    std::shared_ptr<Work> self = std::move(p->abi_self_);
    p->abi_claimed_.store(false, std::memory_order_release);
  }
};

inline std::string& tls_error() {
  thread_local std::string s;
  return s;
}

inline CommHandle* comm_handle(dt_comm_h c) { return reinterpret_cast<CommHandle*>(c); }

// opts: a collective's options; with DT_CALL_WAIT in them the plugin's
// method may return null for an op it has already run to success (the
// caller gets DT_OK and no work, see backend_v1.h).
template <typename F>
dt_status_t op(dt_comm_h c, dt_work_h* out, const dt_call_opts_v1_t* opts, F&& f) {
  auto* h = comm_handle(c);
  std::string err;
  dt_status_t st = guarded(&err, [&] {
    std::shared_ptr<Work> w = f(*h->comm);
    if (!w) {
      if (opts && (opts->flags & DT_CALL_WAIT)) {
        *out = nullptr;
        return DT_OK;
      }
      fail(DT_ERR_INTERNAL, "backend returned no work");
    }
    *out = WorkHandle::make(std::move(w));
    return DT_OK;
  });
  if (st != DT_OK) {
    std::lock_guard<std::mutex> lk(h->mu);
    h->last_error = err;
  }
  return st;
}

template <typename F>
dt_status_t op(dt_comm_h c, dt_work_h* out, F&& f) {
  return op(c, out, nullptr, std::forward<F>(f));
}

inline const dt_call_opts_v1_t& opts_or_default(const dt_call_opts_v1_t* o) {
  static const dt_call_opts_v1_t empty{};
  return o ? *o : empty;
}

template <typename Comm>
struct Trampolines {
  // The plugin's key table, set once by make_backend_v1 (before the host can
  // call comm_create): Options reads the declared defaults from it.
  static inline const dt_config_key_v1_t* keys = nullptr;
  static inline uint32_t num_keys = 0;

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
      init.options = Options(in->config_toml, keys, num_keys);
      init.job_id = in->job_id ? in->job_id : "";
      if (in->struct_size >= offsetof(dt_comm_init_v1_t, reserved)) {
        init.job_token = in->job_token ? in->job_token : "";
        init.num_servers = in->num_servers;
        init.num_workers = in->num_workers;
      }
      auto h = std::make_unique<CommHandle>();
      h->comm = std::make_unique<Comm>(init);
      *out = reinterpret_cast<dt_comm_h>(h.release());
      return DT_OK;
    });
  }
  static const char* backend_last_error() { return tls_error().c_str(); }
  static dt_status_t comm_destroy(dt_comm_h c) {
    return guarded(nullptr, [&] {
      delete comm_handle(c);
      return DT_OK;
    });
  }
  static dt_status_t comm_abort(dt_comm_h c, const char* reason) {
    return guarded(nullptr, [&] {
      comm_handle(c)->comm->abort(reason ? reason : "aborted");
      return DT_OK;
    });
  }
  static const char* comm_last_error(dt_comm_h c) {
    auto* h = comm_handle(c);
    std::lock_guard<std::mutex> lk(h->mu);
    tls_error() = h->last_error;
    return tls_error().c_str();
  }
  static dt_status_t allreduce(dt_comm_h c, const dt_buffer_v1_t* s, const dt_buffer_v1_t* r, int32_t o,
                               const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, opts, [&](Communicator& m) { return m.allreduce(*s, *r, o, opts_or_default(opts)); });
  }
  static dt_status_t broadcast(dt_comm_h c, const dt_buffer_v1_t* b, const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, opts, [&](Communicator& m) { return m.broadcast(*b, opts_or_default(opts)); });
  }
  static dt_status_t allgather(dt_comm_h c, const dt_buffer_v1_t* s, const dt_buffer_v1_t* r,
                               const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, opts, [&](Communicator& m) { return m.allgather(*s, *r, opts_or_default(opts)); });
  }
  static dt_status_t reduce_scatter(dt_comm_h c, const dt_buffer_v1_t* s, const dt_buffer_v1_t* r, int32_t o,
                                    const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, opts, [&](Communicator& m) { return m.reduce_scatter(*s, *r, o, opts_or_default(opts)); });
  }
  static dt_status_t reduce(dt_comm_h c, const dt_buffer_v1_t* s, const dt_buffer_v1_t* r, int32_t o,
                            const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, opts, [&](Communicator& m) { return m.reduce(*s, *r, o, opts_or_default(opts)); });
  }
  static dt_status_t alltoall(dt_comm_h c, const dt_buffer_v1_t* s, const dt_buffer_v1_t* r,
                              const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, opts, [&](Communicator& m) { return m.alltoall(*s, *r, opts_or_default(opts)); });
  }
  static dt_status_t barrier(dt_comm_h c, const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, opts, [&](Communicator& m) { return m.barrier(opts_or_default(opts)); });
  }
  static dt_status_t send(dt_comm_h c, const dt_buffer_v1_t* b, int32_t peer, const dt_call_opts_v1_t* opts,
                          dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.send(*b, peer, opts_or_default(opts)); });
  }
  static dt_status_t recv(dt_comm_h c, const dt_buffer_v1_t* b, int32_t peer, const dt_call_opts_v1_t* opts,
                          dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.recv(*b, peer, opts_or_default(opts)); });
  }
  static dt_status_t ps_table(dt_comm_h c, const dt_ps_table_desc_v1_t* d, uint32_t* table,
                              const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) {
      if (!d || !table) fail(DT_ERR_INVALID_USAGE, "ps_table: null argument");
      return m.ps_table(TableDesc::from_c(*d), table, opts_or_default(opts));
    });
  }
  static dt_status_t ps_pull_dense(dt_comm_h c, uint32_t t, const dt_buffer_v1_t* v, const dt_call_opts_v1_t* opts,
                                   dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.ps_pull_dense(t, *v, opts_or_default(opts)); });
  }
  static dt_status_t ps_push_dense(dt_comm_h c, uint32_t t, const dt_buffer_v1_t* g, const dt_call_opts_v1_t* opts,
                                   dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.ps_push_dense(t, *g, opts_or_default(opts)); });
  }
  static dt_status_t ps_pull_sparse(dt_comm_h c, uint32_t t, const uint64_t* keys, uint64_t n, const dt_buffer_v1_t* v,
                                    const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.ps_pull_sparse(t, keys, n, *v, opts_or_default(opts)); });
  }
  static dt_status_t ps_push_sparse(dt_comm_h c, uint32_t t, const uint64_t* keys, uint64_t n, const dt_buffer_v1_t* g,
                                    const float* sc, const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.ps_push_sparse(t, keys, n, *g, sc, opts_or_default(opts)); });
  }
  static dt_status_t ps_save(dt_comm_h c, uint32_t t, const char* dir, int32_t mode, int32_t format,
                             const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) {
      if (!dir) fail(DT_ERR_INVALID_USAGE, "ps_save: null directory");
      return m.ps_save(t, dir, mode, format, opts_or_default(opts));
    });
  }
  static dt_status_t ps_load(dt_comm_h c, uint32_t t, const char* dir, const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) {
      if (!dir) fail(DT_ERR_INVALID_USAGE, "ps_load: null directory");
      return m.ps_load(t, dir, opts_or_default(opts));
    });
  }
  static dt_status_t ps_shrink(dt_comm_h c, uint32_t t, uint32_t flags, const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.ps_shrink(t, flags, opts_or_default(opts)); });
  }
  static dt_status_t ps_barrier(dt_comm_h c, const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.ps_barrier(opts_or_default(opts)); });
  }
  static dt_status_t ps_finish(dt_comm_h c, const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.ps_finish(opts_or_default(opts)); });
  }
  static dt_status_t ps_serve(dt_comm_h c, const dt_call_opts_v1_t* opts, dt_work_h* out) {
    return op(c, out, [&](Communicator& m) { return m.ps_serve(opts_or_default(opts)); });
  }
  static dt_status_t ps_stop(dt_comm_h c, const char* reason) {
    return guarded(nullptr, [&] {
      comm_handle(c)->comm->ps_stop(reason ? reason : "stopped");
      return DT_OK;
    });
  }
  static dt_status_t work_test(dt_work_h w) {
    return guarded(&WorkHandle::error_of(w), [&] { return WorkHandle::work_of(w)->test(); });
  }
  static dt_status_t work_wait(dt_work_h w, int64_t timeout_ms) {
    return guarded(&WorkHandle::error_of(w), [&] { return WorkHandle::work_of(w)->wait(timeout_ms); });
  }
  static const char* work_error(dt_work_h w) {
    std::string& err = WorkHandle::error_of(w);
    std::string e = WorkHandle::work_of(w)->error();
    if (!e.empty()) err = e;
    return err.c_str();
  }
  static void work_release(dt_work_h w) { WorkHandle::release(w); }
};

template <typename Comm>
const dt_backend_v1_t* make_backend_v1(const dt_host_v1_t* host, const char* name, const char* version,
                                       const char* description, uint64_t caps, const dt_config_key_v1_t* keys,
                                       uint32_t nkeys) {
  Log::set_host(host);
  static const dt_backend_v1_t table = [&] {
    using T = Trampolines<Comm>;
    T::keys = keys;
    T::num_keys = nkeys;
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
    t.ps_table = T::ps_table;
    t.ps_pull_dense = T::ps_pull_dense;
    t.ps_push_dense = T::ps_push_dense;
    t.ps_pull_sparse = T::ps_pull_sparse;
    t.ps_push_sparse = T::ps_push_sparse;
    t.ps_save = T::ps_save;
    t.ps_load = T::ps_load;
    t.ps_shrink = T::ps_shrink;
    t.ps_barrier = T::ps_barrier;
    t.ps_finish = T::ps_finish;
    t.ps_serve = T::ps_serve;
    t.ps_stop = T::ps_stop;
    return t;
  }();
  return &table;
}

}  // namespace detail
}  // namespace dtrain::sdk

#define DTRAIN_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

// Exports dtrain_backend_v1 for CommClass. KEYS is a dt_config_key_v1_t array
// (its size is taken with sizeof), or use DTRAIN_EXPORT_BACKEND_V1_NOKEYS.
#define DTRAIN_EXPORT_BACKEND_V1(CommClass, NAME, VERSION, DESCRIPTION, CAPS, KEYS)                                    \
  DTRAIN_PLUGIN_EXPORT const dt_backend_v1_t* dtrain_backend_v1(const dt_host_v1_t* host) {                            \
    return ::dtrain::sdk::detail::make_backend_v1<CommClass>(host, NAME, VERSION, DESCRIPTION, CAPS, KEYS,             \
                                                             static_cast<uint32_t>(sizeof(KEYS) / sizeof((KEYS)[0]))); \
  }
// The same with the keys of a ConfigTable (config_table.h): TABLE is an
// expression giving a const ConfigTable<S>&, e.g. a function returning a static one.
#define DTRAIN_EXPORT_BACKEND_V1_TABLE(CommClass, NAME, VERSION, DESCRIPTION, CAPS, TABLE)                    \
  DTRAIN_PLUGIN_EXPORT const dt_backend_v1_t* dtrain_backend_v1(const dt_host_v1_t* host) {                   \
    const auto& dtrain_keys = (TABLE);                                                                        \
    return ::dtrain::sdk::detail::make_backend_v1<CommClass>(host, NAME, VERSION, DESCRIPTION, CAPS,          \
                                                             dtrain_keys.abi_keys(), dtrain_keys.num_keys()); \
  }
#define DTRAIN_EXPORT_BACKEND_V1_NOKEYS(CommClass, NAME, VERSION, DESCRIPTION, CAPS)                              \
  DTRAIN_PLUGIN_EXPORT const dt_backend_v1_t* dtrain_backend_v1(const dt_host_v1_t* host) {                       \
    return ::dtrain::sdk::detail::make_backend_v1<CommClass>(host, NAME, VERSION, DESCRIPTION, CAPS, nullptr, 0); \
  }
