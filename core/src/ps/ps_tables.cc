// DenseTable and SparseTable: argument checks, then one PS op each.
#include <filesystem>

#include "dtrain/error.h"
#include "dtrain/sdk/caps.h"
#include "plugin/backend_impl.h"
#include "ps/ps_internal.h"

namespace dtrain::ps {

namespace detail {

void require_cap(const CommState& s, uint64_t cap) {
  if (s.backend->supports(cap)) return;
  throw NotSupported("backend '" + s.backend->name() + "' does not support parameter-server tables (" +
                     sdk::caps_string(cap & ~s.backend->info().caps) +
                     "); it supports: " + s.backend->info().caps_string() + ". Set [ps] backend = \"ps_grpc\"");
}

void check_worker_op(const TableState& t, const char* op) {
  if (t.finished && t.finished->load())
    throw InvalidUsage(std::string(op) + " on table '" + t.config.name + "': this worker has finished");
}

void check_values(const TableState& t, const Buffer& b, uint64_t expected, const char* what, const char* op) {
  std::string where = std::string(op) + " on table '" + t.config.name + "'";
  if (b.dtype != DType::F32) throw InvalidUsage(where + ": " + what + " must be f32, got " + dtype_name(b.dtype));
  if (b.device.type != DeviceType::CPU)
    throw InvalidUsage(where + ": " + what + " must be in CPU memory, got " + b.device.str());
  if (b.count != expected)
    throw InvalidUsage(where + ": " + what + " holds " + std::to_string(b.count) + " values, expected " +
                       std::to_string(expected) +
                       (t.config.kind == TableKind::Sparse ? " (keys x dim " + std::to_string(t.config.dim) + ")"
                                                           : " (the table's dim)"));
  if (b.count > 0 && !b.ptr) throw InvalidUsage(where + ": " + what + " is null with count " + std::to_string(b.count));
}

std::shared_ptr<Store> root_store(const CommState& s) {
  std::shared_ptr<Store> st = s.store;
  while (auto* p = dynamic_cast<PrefixStore*>(st.get())) st = p->base();
  return st;
}

std::string absolute_dir(const std::string& dir, const char* op) {
  if (dir.empty()) throw InvalidUsage(std::string(op) + ": the directory is empty");
  std::error_code ec;
  auto p = std::filesystem::absolute(dir, ec);
  return ec ? dir : p.lexically_normal().string();
}

namespace {

std::string label(const TableState& t) { return "table '" + t.config.name + "'"; }
std::string label(const TableState& t, uint64_t n) {
  return label(t) + ", " + std::to_string(n) + " keys x " + std::to_string(t.config.dim);
}
std::string dense_label(const TableState& t) { return label(t) + ", f32 x " + std::to_string(t.config.dim); }

void check_keys(const TableState& t, const uint64_t* keys, size_t n, const char* op) {
  if (n > 0 && !keys)
    throw InvalidUsage(std::string(op) + " on table '" + t.config.name +
                       "': keys is null with n = " + std::to_string(n));
}

void check_sparse_op(const TableState& t, const uint64_t* keys, size_t n, const Buffer& b, const char* what,
                     const char* op) {
  check_worker_op(t, op);
  require_cap(*t.comm, DT_CAP_PS_SPARSE);
  check_keys(t, keys, n, op);
  check_values(t, b, n * t.config.dim, what, op);
}

// A dense pull or push; `entry` is the ABI's ps_pull_dense or ps_push_dense.
template <typename Entry>
std::shared_ptr<Work> dense_op(const std::shared_ptr<TableState>& t, const Buffer& b, const char* what, const char* op,
                               const char* entry_name, Entry dt_backend_v1_t::*entry, CallOptions o) {
  auto& s = *t->comm;
  check_worker_op(*t, op);
  require_cap(s, DT_CAP_PS_DENSE);
  check_values(*t, b, t->config.dim, what, op);
  auto v = dtrain::detail::to_abi(b);
  return submit_ps(t->comm, entry_name, DT_CAP_PS_DENSE, dense_label(*t), o,
                   [&](auto& opts, dt_work_h* h) { return (s.table->*entry)(s.handle, t->id, &v, &opts, h); });
}

}  // namespace

std::shared_ptr<Work> save_op(const std::shared_ptr<TableState>& t, const std::string& dir, SaveMode mode,
                              SaveFormat format, CallOptions o) {
  auto& s = *t->comm;
  check_worker_op(*t, "save");
  require_cap(s, DT_CAP_PS_SERVER);
  std::string abs = absolute_dir(dir, "save");
  return submit_ps(t->comm, "ps_save", DT_CAP_PS_SERVER, label(*t) + " to '" + abs + "'", o,
                   [&](auto& opts, dt_work_h* h) {
                     return s.table->ps_save(s.handle, t->id, abs.c_str(), static_cast<int32_t>(mode),
                                             static_cast<int32_t>(format), &opts, h);
                   });
}

std::shared_ptr<Work> load_op(const std::shared_ptr<TableState>& t, const std::string& dir, CallOptions o) {
  auto& s = *t->comm;
  check_worker_op(*t, "load");
  require_cap(s, DT_CAP_PS_SERVER);
  std::string abs = absolute_dir(dir, "load");
  return submit_ps(t->comm, "ps_load", DT_CAP_PS_SERVER, label(*t) + " from '" + abs + "'", o,
                   [&](auto& opts, dt_work_h* h) { return s.table->ps_load(s.handle, t->id, abs.c_str(), &opts, h); });
}

}  // namespace detail

using detail::check_values;
using detail::check_worker_op;
using detail::require_cap;
using detail::submit_ps;

const std::string& DenseTable::name() const { return s_->config.name; }
uint64_t DenseTable::dim() const { return s_->config.dim; }
const TableConfig& DenseTable::config() const { return s_->config; }
Mode DenseTable::mode() const { return s_->mode; }

std::shared_ptr<Work> DenseTable::pull(const Buffer& values, CallOptions o) {
  return detail::dense_op(s_, values, "values", "pull", "ps_pull_dense", &dt_backend_v1_t::ps_pull_dense, o);
}

std::shared_ptr<Work> DenseTable::push(const Buffer& grads, CallOptions o) {
  return detail::dense_op(s_, grads, "grads", "push", "ps_push_dense", &dt_backend_v1_t::ps_push_dense, o);
}

std::shared_ptr<Work> DenseTable::save(const std::string& dir, SaveMode mode, SaveFormat format, CallOptions o) {
  return detail::save_op(s_, dir, mode, format, o);
}

std::shared_ptr<Work> DenseTable::load(const std::string& dir, CallOptions o) { return detail::load_op(s_, dir, o); }

const std::string& SparseTable::name() const { return s_->config.name; }
uint64_t SparseTable::dim() const { return s_->config.dim; }
const TableConfig& SparseTable::config() const { return s_->config; }
Mode SparseTable::mode() const { return s_->mode; }

std::shared_ptr<Work> SparseTable::pull(const uint64_t* keys, size_t n, const Buffer& values, CallOptions o) {
  auto& s = *s_->comm;
  detail::check_sparse_op(*s_, keys, n, values, "values", "pull");
  auto v = dtrain::detail::to_abi(values);
  return submit_ps(
      s_->comm, "ps_pull_sparse", DT_CAP_PS_SPARSE, detail::label(*s_, n), o,
      [&](auto& opts, dt_work_h* h) { return s.table->ps_pull_sparse(s.handle, s_->id, keys, n, &v, &opts, h); });
}

std::shared_ptr<Work> SparseTable::push(const uint64_t* keys, size_t n, const Buffer& grads, const float* show_click,
                                        CallOptions o) {
  auto& s = *s_->comm;
  detail::check_sparse_op(*s_, keys, n, grads, "grads", "push");
  auto g = dtrain::detail::to_abi(grads);
  return submit_ps(s_->comm, "ps_push_sparse", DT_CAP_PS_SPARSE, detail::label(*s_, n), o,
                   [&](auto& opts, dt_work_h* h) {
                     return s.table->ps_push_sparse(s.handle, s_->id, keys, n, &g, show_click, &opts, h);
                   });
}

std::shared_ptr<Work> SparseTable::save(const std::string& dir, SaveMode mode, SaveFormat format, CallOptions o) {
  return detail::save_op(s_, dir, mode, format, o);
}

std::shared_ptr<Work> SparseTable::load(const std::string& dir, CallOptions o) { return detail::load_op(s_, dir, o); }

std::shared_ptr<Work> SparseTable::shrink(bool new_day, CallOptions o) {
  auto& s = *s_->comm;
  check_worker_op(*s_, "shrink");
  require_cap(s, DT_CAP_PS_SPARSE);
  uint32_t flags = new_day ? DT_PS_SHRINK_NEW_DAY : 0u;
  return submit_ps(s_->comm, "ps_shrink", DT_CAP_PS_SPARSE, detail::label(*s_) + (new_day ? ", new day" : ""), o,
                   [&](auto& opts, dt_work_h* h) { return s.table->ps_shrink(s.handle, s_->id, flags, &opts, h); });
}

}  // namespace dtrain::ps
