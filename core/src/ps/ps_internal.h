#pragma once
// The PS client's shared internals: one table's state and the submission of
// a PS op through the core's Work machinery (comm/submit.h).

#include <atomic>
#include <memory>
#include <string>

#include "comm/comm_state.h"
#include "comm/submit.h"
#include "dtrain/ps.h"

namespace dtrain::ps {

// [A-Za-z0-9_.-]+, at most 200 characters (the ABI's rule for table names).
bool valid_table_name(const std::string& name);

namespace detail {

using dtrain::detail::CommState;

// What a DenseTable / SparseTable handle points at.
struct TableState {
  std::shared_ptr<CommState> comm;
  TableConfig config;
  Mode mode = Mode::Sync;
  uint32_t id = 0;
  // The worker's "finished" flag: ops after finish() are refused.
  std::shared_ptr<std::atomic<bool>> finished;
};

// Throws NotSupported("backend 'gloo' does not support parameter-server
// tables (ps-dense)") when the backend lacks cap.
void require_cap(const CommState& s, uint64_t cap);
// The checks every worker op makes before the plugin sees it.
void check_worker_op(const TableState& t, const char* op);
// Buffer checks: f32, CPU, count == expected, non-null.
void check_values(const TableState& t, const Buffer& b, uint64_t expected, const char* what, const char* op);

// The store the launcher's `ps/stop` lives in: the communicator's store with
// every PrefixStore peeled off.
std::shared_ptr<Store> root_store(const CommState& s);

// Submits one PS op: a work like a collective's (deadline, watchdog, abort),
// marked ps so that a refused request fails that op only.
template <typename Call>
std::shared_ptr<Work> submit_ps(const std::shared_ptr<CommState>& s, const char* op, uint64_t cap, std::string label,
                                CallOptions o, Call&& call, bool unbounded = false) {
  dtrain::detail::OpDesc d{op, cap, false, unbounded};
  return dtrain::detail::submit(s, d, nullptr, nullptr, -1, o, std::forward<Call>(call),
                                [&](dtrain::detail::WorkState& w) {
                                  w.ps = true;
                                  w.label = std::move(label);
                                });
}

// save / load of any table kind (the same ops for both).
std::shared_ptr<Work> save_op(const std::shared_ptr<TableState>& t, const std::string& dir, SaveMode mode,
                              SaveFormat format, CallOptions o);
std::shared_ptr<Work> load_op(const std::shared_ptr<TableState>& t, const std::string& dir, CallOptions o);

// An absolute path (the servers resolve it, maybe from another cwd).
std::string absolute_dir(const std::string& dir, const char* op);

}  // namespace detail
}  // namespace dtrain::ps

namespace dtrain::ps {
struct DenseTable::State : detail::TableState {};
struct SparseTable::State : detail::TableState {};
}  // namespace dtrain::ps
