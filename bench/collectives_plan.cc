// `dtrain-bench collectives`: the plan (sizes, dtype, options) from the command line.
#include "collectives_internal.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "options.h"  // conformance/: --option key=value as TOML

namespace dtrain::bench::coll {

// ---------------------------------------------------------------- the plan

namespace {
constexpr std::pair<const char*, Op> kOps[] = {
    {"allreduce", Op::Allreduce}, {"broadcast", Op::Broadcast}, {"allgather", Op::Allgather}};
}  // namespace

Op parse_op(const std::string& s) {
  for (const auto& [name, op] : kOps)
    if (s == name) return op;
  throw InvalidUsage("--op " + s + " is not benchmarked; use allreduce, broadcast or allgather");
}

const char* op_name(Op op) {
  for (const auto& [name, o] : kOps)
    if (o == op) return name;
  return "?";
}

size_t parse_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0) throw InvalidUsage("size '" + text + "' is not a number (examples: 8, 4K, 64M, 1G)");
  uint64_t v = std::stoull(text.substr(0, i));
  std::string unit = text.substr(i);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::map<std::string, uint64_t> mult = {{"", 1},
                                                       {"b", 1},
                                                       {"k", 1ull << 10},
                                                       {"kb", 1ull << 10},
                                                       {"kib", 1ull << 10},
                                                       {"m", 1ull << 20},
                                                       {"mb", 1ull << 20},
                                                       {"mib", 1ull << 20},
                                                       {"g", 1ull << 30},
                                                       {"gb", 1ull << 30},
                                                       {"gib", 1ull << 30}};
  auto it = mult.find(unit);
  if (it == mult.end()) throw InvalidUsage("size '" + text + "' has an unknown unit (use K, M or G)");
  return static_cast<size_t>(v * it->second);
}

std::string human_bytes(size_t b) {
  if (b >= (1u << 30) && b % (1u << 30) == 0) return fmt::format("{} GiB", b >> 30);
  if (b >= (1u << 20) && b % (1u << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= (1u << 10) && b % (1u << 10) == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

std::string unquote(const std::string& v) {
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front())
    return v.substr(1, v.size() - 2);
  return v;
}

Plan make_plan(const CollectivesOptions& o) {
  Plan p;
  if (o.backend.empty()) throw InvalidUsage("--backend is required (e.g. --backend gloo)");
  if (o.world_size < 1) throw InvalidUsage("--world-size must be >= 1");
  if (o.world_size > 64) throw InvalidUsage("--world-size above 64 is not sensible on one host");
  if (o.step_factor < 2) throw InvalidUsage("--step-factor must be >= 2");
  if (o.warmup < 0 || o.trials < 0) throw InvalidUsage("--warmup must be >= 0 and --trials >= 1 (0: auto)");
  p.op = parse_op(o.op);
  p.dtype = parse_dtype(o.dtype);
  p.world = o.world_size;
  if (o.iters != "auto") {
    try {
      p.fixed_iters = std::stoi(o.iters);
    } catch (const std::exception&) {
      throw InvalidUsage("--iters must be 'auto' or a positive number, got '" + o.iters + "'");
    }
    if (p.fixed_iters < 1) throw InvalidUsage("--iters must be >= 1");
  }
  for (const auto& [key, literal] : conformance::parse_option_items(o.options)) {
    const std::string& value = literal;
    p.config_toml += key + " = " + literal + "\n";
    p.options_text += (p.options_text.empty() ? "" : ", ") + key + " = " + literal;
    if (o.backend == "gloo") {
      if (key == "algorithm") p.gloo.algorithm = unquote(value);
      if (key == "small_message_bytes") p.gloo.small_message_bytes = std::stoull(unquote(value));
      if (key == "bcube_base") p.gloo.bcube_base = std::stoi(unquote(value));
    }
  }
  gloo_allreduce_algorithm(p.gloo, o.world_size, 0, 0);  // validates the name
  size_t esz = dtype_size(p.dtype);
  size_t lo = parse_size(o.min_bytes), hi = parse_size(o.max_bytes);
  if (lo == 0 || lo > hi) throw InvalidUsage("need 0 < --min-bytes <= --max-bytes");
  for (size_t b = lo; b <= hi; b *= static_cast<size_t>(o.step_factor)) {
    Case c;
    size_t unit = esz * (p.op == Op::Allgather ? static_cast<size_t>(p.world) : 1);
    c.count = b / unit;
    c.bytes = c.count * unit;
    if (c.count == 0) continue;
    if (!p.cases.empty() && p.cases.back().bytes == c.bytes) continue;
    p.cases.push_back(c);
    if (b > hi / static_cast<size_t>(o.step_factor)) break;
  }
  if (p.cases.empty()) throw InvalidUsage("no size in [--min-bytes, --max-bytes] holds a whole element per rank");
  double n = p.world;
  p.busbw_factor = p.op == Op::Allreduce ? 2 * (n - 1) / n : p.op == Op::Allgather ? (n - 1) / n : 1;
#ifdef DTRAIN_BENCH_HAVE_GLOO
  p.gloo_skip = GlooReference::unsupported_reason(p.dtype);
#else
  p.gloo_skip = "this dtrain-bench was built without Gloo";
#endif
  if (o.no_reference || o.no_gloo) p.gloo_skip = "turned off";
  if (o.backend == "nccl") {
    // NCCL takes CUDA buffers only: raw NCCL on the same buffers is the reference.
#ifndef DTRAIN_BENCH_HAVE_NCCL
    throw InvalidUsage(
        "--backend nccl: this dtrain-bench was built without CUDA's runtime and NCCL (its buffers would be host "
        "memory, which the nccl backend refuses); rebuild where both are found (docs/gpu.md)");
#endif
    p.cuda = true;
    p.gloo_skip = "not with --backend nccl (the buffers are CUDA memory; the reference is raw NCCL)";
    p.nccl_skip = o.no_reference || o.no_nccl ? "turned off" : "";
    for (const auto& [key, literal] : conformance::parse_option_items(o.options))
      if (key == "device") p.cuda_device = std::stoi(unquote(literal));
  }
  if (o.aa && p.cuda && !p.nccl_skip.empty())
    throw InvalidUsage("--aa needs the raw-NCCL reference (" + p.nccl_skip + ")");
  if (o.aa && !p.cuda && !p.gloo_skip.empty())
    throw InvalidUsage("--aa needs the raw-Gloo reference (" + p.gloo_skip + ")");
  if (o.aa && o.no_dtrain) throw InvalidUsage("--aa and --no-dtrain exclude each other");
  return p;
}

}  // namespace dtrain::bench::coll
