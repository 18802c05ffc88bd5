// Sharding, the descriptor checks and Table::create. The two table kinds live
// in dense_table.cc and sparse_table.cc, the files in files.cc.

#include "engine/table.h"

#include <algorithm>
#include <sstream>
#include <string_view>
#include <type_traits>

#include "engine/files.h"
#include "engine/init.h"
#include "engine/factories.h"

namespace dtrain::ps_grpc {

uint32_t Sharding::shard_of(uint64_t key) const { return static_cast<uint32_t>(mix64(key) % num_shards); }

int Sharding::server_of(uint64_t key) const {
  return static_cast<int>(shard_of(key) % static_cast<uint32_t>(num_servers));
}

uint64_t Sharding::dense_begin(uint64_t dim, int server) const {
  const uint64_t s = static_cast<uint64_t>(std::clamp(server, 0, num_servers));
  const uint64_t n = static_cast<uint64_t>(num_servers);
  return s * (dim / n) + std::min(s, dim % n);
}

void check_worker(const std::string& table, int worker, int workers) {
  if (worker < 0 || worker >= workers)
    sdk::fail(DT_ERR_INVALID_USAGE, "table '" + table + "': worker " + std::to_string(worker) +
                                        " is out of range (the job has " + std::to_string(workers) + " workers)");
}

namespace {

std::string num(double v) {
  std::ostringstream o;
  o.precision(17);
  o << v;
  return o.str();
}

// A descriptor field's value in a message: kind and optimizer by name,
// numbers exactly.
template <class T>
std::string shown(std::string_view field, T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return num(v);
  } else {
    if (field == "kind") return kind_name(static_cast<int>(v));
    if (field == "optimizer") return optimizer_name(static_cast<int>(v));
    return std::to_string(v);
  }
}

}  // namespace

uint64_t Table::begin_dense_push(int) {
  sdk::fail(DT_ERR_INVALID_USAGE, "table '" + desc_.name + "' takes no dense push in ranges (" + kind_name(desc_.kind) +
                                      ", mode " + std::to_string(desc_.mode) + ")");
}

void Table::push_dense_range(uint64_t, uint64_t, const float*, uint64_t) { begin_dense_push(0); }

std::string Table::differs(const sdk::TableDesc& o) const {
  const sdk::TableDesc& d = desc_;
  auto diff = [](const char* field, const std::string& here, const std::string& there) {
    return std::string(field) + " is " + here + " here and " + there + " in the request";
  };
  if (d.name != o.name) return diff("name", "'" + d.name + "'", "'" + o.name + "'");
#define DTRAIN_PS_CMP(field, ...) \
  if (d.field != o.field) return diff(#field, shown(#field, d.field), shown(#field, o.field));
  DTRAIN_PS_TABLE_FIELDS(DTRAIN_PS_CMP)
#undef DTRAIN_PS_CMP
  return "";
}

std::unique_ptr<Table> Table::create(const sdk::TableDesc& desc, const Sharding& sharding, int server,
                                     int num_workers) {
  const std::string t = "table '" + desc.name + "': ";
  auto bad = [&](const std::string& what) { sdk::fail(DT_ERR_INVALID_USAGE, t + what); };
  if (!safe_name(desc.name)) bad("the name must be [A-Za-z0-9_.-]+");
  if (desc.kind != DT_PS_TABLE_DENSE && desc.kind != DT_PS_TABLE_SPARSE)
    bad("unknown kind " + std::to_string(desc.kind));
  if (desc.dim == 0) bad("dim is 0");
  if (desc.dtype != DT_DTYPE_F32) bad(std::string("dtype ") + sdk::dtype_name(desc.dtype) + ", tables hold f32");
  if (desc.mode < DT_PS_MODE_SYNC || desc.mode > DT_PS_MODE_GEO) bad("unknown mode " + std::to_string(desc.mode));
  if (desc.optimizer < DT_PS_OPT_SGD || desc.optimizer > DT_PS_OPT_ADAM)
    bad("unknown optimizer " + std::to_string(desc.optimizer));
  if (desc.initializer < DT_PS_INIT_CONSTANT || desc.initializer > DT_PS_INIT_NORMAL)
    bad("unknown initializer " + std::to_string(desc.initializer));
  if (desc.mode == DT_PS_MODE_GEO && desc.optimizer != DT_PS_OPT_SGD)
    bad(std::string("GEO mode applies the optimizer on the workers and accepts only sgd, not ") +
        optimizer_name(desc.optimizer));
  if (desc.kind == DT_PS_TABLE_SPARSE && desc.dim > (1u << 20))
    bad("dim " + std::to_string(desc.dim) + " is over the sparse row limit of 1048576");
  if (sharding.num_servers < 1 || server < 0 || server >= sharding.num_servers)
    bad("server " + std::to_string(server) + " of " + std::to_string(sharding.num_servers));
  if (sharding.num_shards < 1) bad("num_shards is 0");
  if (num_workers < 1) bad("num_workers is " + std::to_string(num_workers));
  if (desc.kind == DT_PS_TABLE_DENSE) return make_dense_table(desc, sharding, server, num_workers);
  return make_sparse_table(desc, sharding, server, num_workers);
}

}  // namespace dtrain::ps_grpc
