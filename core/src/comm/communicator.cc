#include "dtrain/communicator.h"

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>

#include "comm/comm_state.h"
#include "comm/submit.h"
#include "comm/watchdog.h"
#include "common/log.h"
#include "dtrain/config.h"
#include "plugin/backend_impl.h"

namespace dtrain {

using detail::Clock;
using detail::CommState;
using detail::WorkState;

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Prod: return "prod";
  }
  return "?";
}

namespace {

dt_status_t status_of(const std::exception& e) {
  if (auto* d = dynamic_cast<const Error*>(&e)) return detail::status_of_kind(d->kind());
  return DT_ERR_INTERNAL;
}

Store& bridge_store(void* ctx) { return *static_cast<detail::StoreBridge*>(ctx)->store; }

dt_status_t bridge_set(void* ctx, const char* key, const void* value, uint64_t len) {
  try {
    auto* p = static_cast<const uint8_t*>(value);
    bridge_store(ctx).set(key, Bytes(p, p + len));
    return DT_OK;
  } catch (const std::exception& e) {
    detail::logger().warn("store set '{}' failed: {}", key, e.what());
    return status_of(e);
  }
}

dt_status_t bridge_get(void* ctx, const char* key, int64_t timeout_ms, void** value, uint64_t* len) {
  try {
    auto t = timeout_ms < 0 ? Store::kDefaultTimeout : std::chrono::milliseconds(timeout_ms);
    Bytes b = bridge_store(ctx).get(key, t);
    void* out = std::malloc(b.empty() ? 1 : b.size());
    if (!out) return DT_ERR_SYSTEM;
    if (!b.empty()) std::memcpy(out, b.data(), b.size());
    *value = out;
    *len = b.size();
    return DT_OK;
  } catch (const std::exception& e) {
    detail::logger().warn("store get '{}' failed: {}", key, e.what());
    return status_of(e);
  }
}

void bridge_free(void*, void* value) { std::free(value); }

dt_status_t bridge_add(void* ctx, const char* key, int64_t delta, int64_t* result) {
  try {
    int64_t v = bridge_store(ctx).add(key, delta);
    if (result) *result = v;
    return DT_OK;
  } catch (const std::exception& e) {
    return status_of(e);
  }
}

dt_status_t bridge_wait(void* ctx, const char* const* keys, uint32_t n, int64_t timeout_ms) {
  try {
    std::vector<std::string> k(keys, keys + n);
    auto t = timeout_ms < 0 ? Store::kDefaultTimeout : std::chrono::milliseconds(timeout_ms);
    bridge_store(ctx).wait(k, t);
    return DT_OK;
  } catch (const std::exception& e) {
    return status_of(e);
  }
}

dt_status_t bridge_remove(void* ctx, const char* key) {
  try {
    bridge_store(ctx).remove(key);
    return DT_OK;
  } catch (const std::exception& e) {
    return status_of(e);
  }
}

// Same creation order on every rank gives the same instance number, so a
// communicator re-created under one name never reads its predecessor's keys.
// Each rank counts its own creations in the store itself, so the numbering
// follows the store, whatever process or object holds it. The servers and
// workers of a PS communicator count apart (both have a rank 0).
std::string instance_name(const CommOptions& o, bool ps) {
  std::string who = std::to_string(o.rank);
  if (ps) who = std::string(to_string(o.role)) + "." + who;
  int64_t n = o.store->add("dtrain/instances/" + o.name + "/" + who, 1) - 1;
  return o.name + "." + std::to_string(n);
}

void check_ps_options(const Backend& b, const CommOptions& o) {
  if (!b.supports(DT_CAP_PS_SERVER))
    throw NotSupported("backend '" + b.name() + "' does not support parameter-server tables (ps-server), but a " +
                       "parameter-server communicator (num_servers = " + std::to_string(o.num_servers) +
                       ") was asked of it; it supports: " + b.info().caps_string() +
                       ". Name a PS backend ([ps] backend = \"ps_grpc\")");
  if (o.num_servers < 1 || o.num_workers < 1)
    throw InvalidUsage("a parameter-server communicator needs num_servers >= 1 and num_workers >= 1, got " +
                       std::to_string(o.num_servers) + " and " + std::to_string(o.num_workers));
  if (o.world_size != o.num_workers)
    throw InvalidUsage("a parameter-server communicator's world_size must equal num_workers (" +
                       std::to_string(o.num_workers) + "), got " + std::to_string(o.world_size));
  int count = o.role == Role::Server ? o.num_servers : o.num_workers;
  if (o.rank < 0 || o.rank >= count)
    throw InvalidUsage(std::string(to_string(o.role)) + " index " + std::to_string(o.rank) + " is outside the " +
                       std::to_string(count) + " " + to_string(o.role) + "s of the job");
  if (!o.store) throw InvalidUsage("a parameter-server communicator needs a store shared by its servers and workers");
}

}  // namespace

std::shared_ptr<CommState> detail::create_comm_state(const std::shared_ptr<Backend>& backend, const CommOptions& o) {
  const auto& info = backend->info();
  bool ps = o.num_servers > 0 || o.num_workers > 0;
  if (ps) {
    check_ps_options(*backend, o);
  } else {
    if (o.world_size < 1) throw InvalidUsage("world_size must be >= 1, got " + std::to_string(o.world_size));
    if (o.rank < 0 || o.rank >= o.world_size)
      throw InvalidUsage("rank " + std::to_string(o.rank) + " is outside the world of " + std::to_string(o.world_size) +
                         " ranks");
  }
  if (o.timeout.count() <= 0) throw InvalidUsage("communicator timeout must be positive");
  auto store = o.store ? o.store : std::make_shared<MemoryStore>();
  if (!o.store && o.world_size > 1)
    throw InvalidUsage("a communicator of " + std::to_string(o.world_size) + " ranks needs a store");

  if (!o.config_toml.empty()) {
    ConfigSchema schema;
    for (auto& k : info.config_keys) schema.add(k.path, k.type, k.default_text, k.description);
    Config::from_string(o.config_toml, "[" + info.name + "] options").validate(schema);
  }

  auto state = std::make_shared<CommState>();
  state->backend = backend;
  state->table = backend->impl().table;
  state->caps = info.caps;
  state->call_wait = info.abi_minor >= 2;
  state->rank = o.rank;
  state->size = o.world_size;
  state->ps = ps;
  state->role = o.role;
  state->num_servers = o.num_servers;
  CommOptions scoped = o;
  scoped.store = store;
  state->name = instance_name(scoped, ps);
  state->timeout = o.timeout;
  state->store = std::make_shared<PrefixStore>("dtrain/comm/" + state->name, store);
  state->bridge.store = std::make_shared<PrefixStore>("p", state->store);
  state->bridge.table.ctx = &state->bridge;
  state->bridge.table.set = bridge_set;
  state->bridge.table.get = bridge_get;
  state->bridge.table.free_value = bridge_free;
  state->bridge.table.add = bridge_add;
  state->bridge.table.wait = bridge_wait;
  state->bridge.table.remove = bridge_remove;
  state->publish_heartbeat(true);

  dt_comm_init_v1_t init{};
  init.struct_size = sizeof(init);
  init.rank = o.rank;
  init.world_size = o.world_size;
  init.local_rank = o.local_rank;
  init.local_world_size = o.local_world_size;
  init.role = static_cast<int32_t>(o.role);
  init.timeout_ms = o.timeout.count();
  init.store = &state->bridge.table;
  init.config_toml = o.config_toml.c_str();
  init.job_id = o.job_id.c_str();
  init.job_token = o.job_token.c_str();
  init.num_servers = o.num_servers;
  init.num_workers = o.num_workers;
  dt_comm_h h = nullptr;
  dt_status_t st = state->table->comm_create(&init, &h);
  if (st != DT_OK || !h) {
    const char* e = state->table->backend_last_error ? state->table->backend_last_error() : nullptr;
    std::string who = ps ? std::string(to_string(o.role)) + " " + std::to_string(o.rank) + ": cannot create a " +
                               "parameter-server communicator of " + std::to_string(o.num_servers) + " servers and " +
                               std::to_string(o.num_workers) + " workers"
                         : "rank " + std::to_string(o.rank) + ": cannot create a communicator of " +
                               std::to_string(o.world_size) + " ranks";
    std::rethrow_exception(detail::make_backend_error(info.name, st == DT_OK ? DT_ERR_INTERNAL : st,
                                                      who + ": " + (e && *e ? e : "no reason given")));
  }
  state->handle = h;
  detail::Watchdog::instance().add(state);
  return state;
}

std::shared_ptr<Communicator> Backend::create_communicator(const CommOptions& o) {
  return std::make_shared<Communicator>(detail::create_comm_state(shared_from_this(), o));
}

Communicator::Communicator(std::shared_ptr<CommState> state) : state_(std::move(state)) {}
Communicator::~Communicator() = default;
int Communicator::rank() const { return state_->rank; }
int Communicator::size() const { return state_->size; }
const std::string& Communicator::backend_name() const { return state_->backend->name(); }
std::shared_ptr<Backend> Communicator::backend() const { return state_->backend; }
bool Communicator::is_poisoned() const { return state_->poisoned.load(); }
std::string Communicator::poison_reason() const { return state_->reason(); }
void Communicator::abort(const std::string& reason) {
  state_->poison("rank " + std::to_string(state_->rank) + ": " + reason);
}

namespace {

using detail::check_buffer;
using detail::OpDesc;
using detail::submit;
using detail::to_abi;

void check_same_type(const Buffer& a, const Buffer& b, const char* op) {
  if (a.dtype != b.dtype)
    throw InvalidUsage(std::string(op) + ": send is " + dtype_name(a.dtype) + " but recv is " + dtype_name(b.dtype));
}

void check_send_recv(const CommState& s, const Buffer& send, const Buffer& recv, const char* op) {
  check_buffer(s, send, "send", op);
  check_buffer(s, recv, "recv", op);
  check_same_type(send, recv, op);
}

void check_rank(const CommState& s, int r, const char* what, const char* op) {
  if (r < 0 || r >= s.size)
    throw InvalidUsage(std::string(op) + ": " + what + " " + std::to_string(r) + " is not a rank of this " +
                       std::to_string(s.size) + "-rank communicator");
}

void check_p2p(const CommState& s, const Buffer& b, int peer, int tag, const char* op) {
  check_buffer(s, b, "", op);
  check_rank(s, peer, "peer", op);
  if (peer == s.rank) throw InvalidUsage(std::string(op) + ": peer " + std::to_string(peer) + " is this rank itself");
  if (tag < 0) throw InvalidUsage(std::string(op) + ": tag must be >= 0");
}

constexpr OpDesc kAllreduce{"allreduce", DT_CAP_ALLREDUCE, true};
constexpr OpDesc kBroadcast{"broadcast", DT_CAP_BROADCAST, true};
constexpr OpDesc kAllgather{"allgather", DT_CAP_ALLGATHER, true};
constexpr OpDesc kReduceScatter{"reduce_scatter", DT_CAP_REDUCE_SCATTER, true};
constexpr OpDesc kReduce{"reduce", DT_CAP_REDUCE, true};
constexpr OpDesc kAlltoall{"alltoall", DT_CAP_ALLTOALL, true};
constexpr OpDesc kBarrier{"barrier", DT_CAP_BARRIER, true};
constexpr OpDesc kSend{"send", DT_CAP_SENDRECV, false};
constexpr OpDesc kRecv{"recv", DT_CAP_SENDRECV, false};

// A send or recv: `entry` is the ABI's send or recv.
template <typename Entry>
std::shared_ptr<Work> point_to_point(const std::shared_ptr<CommState>& state, const OpDesc& d,
                                     Entry dt_backend_v1_t::*entry, const Buffer& buf, int peer, int tag,
                                     CallOptions o) {
  auto& s = *state;
  check_p2p(s, buf, peer, tag, d.name);
  auto a = to_abi(buf);
  return submit(state, d, &buf, nullptr, peer, o, [&](auto& opts, dt_work_h* h) {
    opts.tag = tag;
    return (s.table->*entry)(s.handle, &a, peer, &opts, h);
  });
}

// A collective op, which may run inline on the communicator's spare work.
template <typename Submit>
std::shared_ptr<Work> run_collective(const std::shared_ptr<CommState>& s, detail::SpareWork& spare, const OpDesc& d,
                                     const Buffer* b, const char* op, CallOptions o, Submit&& call) {
  return submit(s, d, b, op, -1, o, std::forward<Submit>(call), detail::NoPrepare{}, &spare);
}

}  // namespace

std::shared_ptr<Work> Communicator::allreduce(const Buffer& buf, ReduceOp op, CallOptions o) {
  return allreduce(buf, buf, op, o);
}

std::shared_ptr<Work> Communicator::allreduce(const Buffer& send, const Buffer& recv, ReduceOp op, CallOptions o) {
  auto& s = *state_;
  check_send_recv(s, send, recv, "allreduce");
  if (send.count != recv.count)
    throw InvalidUsage("allreduce: send has " + std::to_string(send.count) + " elements but recv has " +
                       std::to_string(recv.count));
  auto a = to_abi(send), b = to_abi(recv);
  return run_collective(state_, spare_, kAllreduce, &send, to_string(op), o, [&](auto& opts, dt_work_h* h) {
    return s.table->allreduce(s.handle, &a, &b, static_cast<int32_t>(op), &opts, h);
  });
}

std::shared_ptr<Work> Communicator::broadcast(const Buffer& buf, int root, CallOptions o) {
  auto& s = *state_;
  check_buffer(s, buf, "", "broadcast");
  check_rank(s, root, "root", "broadcast");
  auto a = to_abi(buf);
  return run_collective(state_, spare_, kBroadcast, &buf, nullptr, o, [&](auto& opts, dt_work_h* h) {
    opts.root = root;
    return s.table->broadcast(s.handle, &a, &opts, h);
  });
}

std::shared_ptr<Work> Communicator::allgather(const Buffer& send, const Buffer& recv, CallOptions o) {
  auto& s = *state_;
  check_send_recv(s, send, recv, "allgather");
  if (recv.count != send.count * static_cast<size_t>(s.size))
    throw InvalidUsage("allgather: recv must hold send.count x world size = " + std::to_string(send.count * s.size) +
                       " elements, it has " + std::to_string(recv.count));
  auto a = to_abi(send), b = to_abi(recv);
  return run_collective(state_, spare_, kAllgather, &send, nullptr, o,
                        [&](auto& opts, dt_work_h* h) { return s.table->allgather(s.handle, &a, &b, &opts, h); });
}

std::shared_ptr<Work> Communicator::reduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op, CallOptions o) {
  auto& s = *state_;
  check_send_recv(s, send, recv, "reduce_scatter");
  if (send.count != recv.count * static_cast<size_t>(s.size))
    throw InvalidUsage("reduce_scatter: send must hold recv.count x world size = " +
                       std::to_string(recv.count * s.size) + " elements, it has " + std::to_string(send.count));
  auto a = to_abi(send), b = to_abi(recv);
  return run_collective(state_, spare_, kReduceScatter, &recv, to_string(op), o, [&](auto& opts, dt_work_h* h) {
    return s.table->reduce_scatter(s.handle, &a, &b, static_cast<int32_t>(op), &opts, h);
  });
}

std::shared_ptr<Work> Communicator::reduce(const Buffer& send, const Buffer& recv, ReduceOp op, int root,
                                           CallOptions o) {
  auto& s = *state_;
  check_rank(s, root, "root", "reduce");
  check_buffer(s, send, "send", "reduce");
  if (s.rank == root) {
    check_buffer(s, recv, "recv", "reduce");
    check_same_type(send, recv, "reduce");
    if (send.count != recv.count)
      throw InvalidUsage("reduce: on the root, recv must hold " + std::to_string(send.count) + " elements, it has " +
                         std::to_string(recv.count));
  }
  auto a = to_abi(send), b = to_abi(s.rank == root ? recv : Buffer(nullptr, 0, send.dtype, send.device));
  return run_collective(state_, spare_, kReduce, &send, to_string(op), o, [&](auto& opts, dt_work_h* h) {
    opts.root = root;
    return s.table->reduce(s.handle, &a, &b, static_cast<int32_t>(op), &opts, h);
  });
}

std::shared_ptr<Work> Communicator::alltoall(const Buffer& send, const Buffer& recv, CallOptions o) {
  auto& s = *state_;
  check_send_recv(s, send, recv, "alltoall");
  if (send.count != recv.count || send.count % s.size != 0)
    throw InvalidUsage("alltoall: send and recv must have the same count, divisible by the world size " +
                       std::to_string(s.size) + " (send " + std::to_string(send.count) + ", recv " +
                       std::to_string(recv.count) + ")");
  auto a = to_abi(send), b = to_abi(recv);
  return run_collective(state_, spare_, kAlltoall, &send, nullptr, o,
                        [&](auto& opts, dt_work_h* h) { return s.table->alltoall(s.handle, &a, &b, &opts, h); });
}

std::vector<std::shared_ptr<Work>> Communicator::alltoallv(const Buffer& send, const std::vector<size_t>& send_counts,
                                                           const Buffer& recv, const std::vector<size_t>& recv_counts,
                                                           CallOptions o) {
  auto& s = *state_;
  check_same_type(send, recv, "alltoallv");
  const auto n = static_cast<size_t>(s.size);
  if (send_counts.size() != n || recv_counts.size() != n)
    throw InvalidUsage("alltoallv: " + std::to_string(send_counts.size()) + " send counts and " +
                       std::to_string(recv_counts.size()) + " recv counts for " + std::to_string(n) +
                       " ranks: give one count per rank");
  auto total = [](const std::vector<size_t>& c) { return std::accumulate(c.begin(), c.end(), size_t{0}); };
  if (total(send_counts) > send.count || total(recv_counts) > recv.count)
    throw InvalidUsage("alltoallv: the counts add up to " + std::to_string(total(send_counts)) + " to send and " +
                       std::to_string(total(recv_counts)) + " to receive, beyond the buffers' " +
                       std::to_string(send.count) + " and " + std::to_string(recv.count));
  auto block = [](const Buffer& b, const std::vector<size_t>& counts, size_t j) {
    size_t off = std::accumulate(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(j), size_t{0});
    return Buffer(static_cast<char*>(b.ptr) + off * dtype_size(b.dtype), counts[j], b.dtype, b.device, b.stream);
  };
  std::vector<std::shared_ptr<Work>> works;
  // Receives first, then sends, each in rank order from this rank on, so
  // that no pair's messages wait behind another pair's. A message that
  // cannot be posted (a poisoned communicator) aborts those already posted.
  try {
    for (size_t k = 1; k < n; ++k) {
      size_t j = (static_cast<size_t>(s.rank) + n - k) % n;
      if (recv_counts[j] > 0)
        works.push_back(this->recv(block(recv, recv_counts, j), static_cast<int>(j), kAlltoallvTag, o));
    }
    for (size_t k = 1; k < n; ++k) {
      size_t j = (static_cast<size_t>(s.rank) + k) % n;
      if (send_counts[j] > 0)
        works.push_back(this->send(block(send, send_counts, j), static_cast<int>(j), kAlltoallvTag, o));
    }
  } catch (...) {
    for (auto& w : works) w->abort();
    throw;
  }
  return works;
}

std::shared_ptr<Work> Communicator::barrier(CallOptions o) {
  auto& s = *state_;
  return run_collective(state_, spare_, kBarrier, nullptr, nullptr, o,
                        [&](auto& opts, dt_work_h* h) { return s.table->barrier(s.handle, &opts, h); });
}

std::shared_ptr<Work> Communicator::send(const Buffer& buf, int peer, int tag, CallOptions o) {
  return point_to_point(state_, kSend, &dt_backend_v1_t::send, buf, peer, tag, o);
}

std::shared_ptr<Work> Communicator::recv(const Buffer& buf, int peer, int tag, CallOptions o) {
  return point_to_point(state_, kRecv, &dt_backend_v1_t::recv, buf, peer, tag, o);
}

}  // namespace dtrain
