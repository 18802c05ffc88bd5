#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "options.h"  // conformance/: --option key=value as TOML
#include "ps_internal.h"
#include "dtrain/error.h"

namespace dtrain::bench::psb {

const char* op_name(Op op) {
  switch (op) {
    case Op::SparsePull: return "sparse pull";
    case Op::SparsePush: return "sparse push";
    case Op::DensePull: return "dense pull";
    case Op::DensePush: return "dense push";
  }
  return "?";
}

std::string Row::label() const {
  if (sparse()) return fmt::format("{} {} key{} x dim {}", op_name(op), human(keys, false), keys == 1 ? "" : "s", dim);
  return fmt::format("{} {}", op_name(op), human(count * 4, true));
}

size_t parse_size(const std::string& text) {
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &pos);
  } catch (const std::exception&) {
    throw InvalidUsage("'" + text + "' is not a size (like 64K, 16M)");
  }
  std::string unit = text.substr(pos);
  if (unit == "K" || unit == "k")
    v <<= 10;
  else if (unit == "M" || unit == "m")
    v <<= 20;
  else if (unit == "G" || unit == "g")
    v <<= 30;
  else if (!unit.empty())
    throw InvalidUsage("'" + text + "': unknown unit '" + unit + "' (K, M, G)");
  return v;
}

std::string human(size_t n, bool bytes) {
  const char* units[] = {"", "K", "M", "G"};
  int u = 0;
  while (n >= 1024 && n % 1024 == 0 && u < 3) n /= 1024, ++u;
  return std::to_string(n) + units[u] + (bytes ? "B" : "");
}

std::vector<Row> make_rows(const PsBenchOptions& o) {
  auto want = [&](const char* what) { return o.only.empty() || std::count(o.only.begin(), o.only.end(), what); };
  if (o.step_factor < 2) throw InvalidUsage("--step-factor must be at least 2");
  std::vector<Row> all, rows;
  if (want("latency")) {
    rows.push_back({Op::SparsePull, true, 8, 1, 0});
    rows.push_back({Op::SparsePush, true, 8, 1, 0});
    rows.push_back({Op::DensePull, true, 0, 0, 64});
    rows.push_back({Op::DensePush, true, 0, 0, 64});
  }
  if (want("sparse")) {
    size_t lo = parse_size(o.min_keys), hi = parse_size(o.max_keys);
    if (lo == 0 || hi < lo) throw InvalidUsage("--min-keys must be > 0 and <= --max-keys");
    for (int dim : o.dims) {
      if (dim <= 0) throw InvalidUsage("--dims: a dimension must be positive");
      for (size_t n = lo; n <= hi; n *= o.step_factor) {
        rows.push_back({Op::SparsePull, false, size_t(dim), n, 0});
        rows.push_back({Op::SparsePush, false, size_t(dim), n, 0});
      }
    }
  }
  if (want("dense")) {
    size_t lo = parse_size(o.min_bytes), hi = parse_size(o.max_bytes);
    if (lo < 4 || hi < lo) throw InvalidUsage("--min-bytes must be >= 4 and <= --max-bytes");
    for (size_t b = lo; b <= hi; b *= o.step_factor) {
      rows.push_back({Op::DensePull, false, 0, 0, b / 4});
      rows.push_back({Op::DensePush, false, 0, 0, b / 4});
    }
  }
  for (auto& r : rows) {
    bool pull = r.op == Op::SparsePull || r.op == Op::DensePull;
    if (std::count(o.ops.begin(), o.ops.end(), pull ? "pull" : "push")) all.push_back(r);
  }
  if (all.empty()) throw InvalidUsage("--only and --ops select no rows");
  return all;
}

std::string config_toml(const PsBenchOptions& o) { return conformance::options_to_toml(o.options); }

void store_barrier(Store& s, const std::string& name, int rank, int world) {
  s.set(name + "/" + std::to_string(rank), std::string("1"));
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(name + "/" + std::to_string(r));
  s.wait(keys, std::chrono::minutes(5));
}

}  // namespace dtrain::bench::psb
