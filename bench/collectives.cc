#include "collectives.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/buffer.h"
#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/sdk/support.h"
#include "dtrain/store.h"
#include "dtrain/work.h"
#include "gloo_reference.h"
#include "process.h"

namespace dtrain::bench {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kWorkerEnv = "DTRAIN_BENCH_WORKER";  // "rank:world:host:port"
constexpr const char* kTokenEnv = "DTRAIN_BENCH_TOKEN";
constexpr const char* kMpiTag = "DTRAIN_BENCH_MPI";
constexpr size_t kSmallBytes = 64 * 1024;  // rows that show the latency difference
constexpr size_t kLargeBytes = 1 << 20;    // rows the bandwidth target applies to
constexpr double kTrialBudgetS = 1.2;      // --trials auto: time per size for both implementations

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// ---------------------------------------------------------------- the plan

enum class Op { Allreduce, Broadcast, Allgather };

Op parse_op(const std::string& s) {
  if (s == "allreduce") return Op::Allreduce;
  if (s == "broadcast") return Op::Broadcast;
  if (s == "allgather") return Op::Allgather;
  throw InvalidUsage("--op " + s + " is not benchmarked; use allreduce, broadcast or allgather");
}

const char* op_name(Op op) {
  switch (op) {
    case Op::Allreduce: return "allreduce";
    case Op::Broadcast: return "broadcast";
    case Op::Allgather: return "allgather";
  }
  return "?";
}

size_t parse_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0) throw InvalidUsage("size '" + text + "' is not a number (examples: 8, 4K, 64M, 1G)");
  uint64_t v = std::stoull(text.substr(0, i));
  std::string unit = text.substr(i);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::map<std::string, uint64_t> mult = {
      {"", 1},          {"b", 1},          {"k", 1ull << 10}, {"kb", 1ull << 10}, {"kib", 1ull << 10},
      {"m", 1ull << 20}, {"mb", 1ull << 20}, {"mib", 1ull << 20}, {"g", 1ull << 30}, {"gb", 1ull << 30},
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

bool is_toml_literal(const std::string& v) {
  if (v == "true" || v == "false") return true;
  if (!v.empty() && (v[0] == '"' || v[0] == '\'' || v[0] == '[' || v[0] == '{')) return true;
  static const std::regex num(R"([+-]?(\d[\d_]*)(\.\d[\d_]*)?([eE][+-]?\d+)?|0x[0-9a-fA-F_]+|[+-]?(inf|nan))");
  return std::regex_match(v, num);
}

std::string toml_quote(const std::string& v) {
  std::string r = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r + "\"";
}

std::string unquote(const std::string& v) {
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front())
    return v.substr(1, v.size() - 2);
  return v;
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

struct Case {
  size_t bytes = 0;  // the size column: the op's buffer (allgather: the gathered result)
  size_t count = 0;  // elements per call (allgather: per rank)
};

struct Plan {
  Op op = Op::Allreduce;
  DType dtype = DType::F32;
  int world = 2;
  std::vector<Case> cases;
  int fixed_iters = 0;  // 0: auto
  std::string config_toml;
  std::string options_text;  // for the header
  GlooRefConfig gloo;
  double busbw_factor = 1;
  std::string gloo_skip;  // why there is no raw-Gloo reference ("" when there is)
};

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
  for (const auto& kv : o.options) {
    auto eq = kv.find('=');
    if (eq == std::string::npos) throw InvalidUsage("--option '" + kv + "' must look like key=value");
    std::string key = trim(kv.substr(0, eq)), value = trim(kv.substr(eq + 1));
    if (key.empty()) throw InvalidUsage("--option '" + kv + "' has an empty key");
    std::string literal = is_toml_literal(value) ? value : toml_quote(value);
    p.config_toml += key + " = " + literal + "\n";
    p.options_text += (p.options_text.empty() ? "" : ", ") + key + " = " + literal;
    if (o.backend == "gloo") {
      if (key == "algorithm") p.gloo.algorithm = unquote(value);
      if (key == "small_message_bytes") p.gloo.small_message_bytes = std::stoull(unquote(value));
      if (key == "bcube_base") p.gloo.bcube_base = std::stoi(unquote(value));
    }
  }
  gloo_allreduce_algorithm(p.gloo, o.world_size, 0);  // validates the name
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
  if (o.aa && !p.gloo_skip.empty()) throw InvalidUsage("--aa needs the raw-Gloo reference (" + p.gloo_skip + ")");
  if (o.aa && o.no_dtrain) throw InvalidUsage("--aa and --no-dtrain exclude each other");
  return p;
}

// ---------------------------------------------------------------- buffers

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Mem = std::unique_ptr<char, FreeDeleter>;

Mem alloc_touched(size_t bytes) {
  size_t n = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
  char* p = static_cast<char*>(std::aligned_alloc(4096, n));
  if (!p) throw IoError("cannot allocate " + std::to_string(n) + " bytes");
  std::memset(p, 0, n);
  return Mem(p);
}

template <typename F>
void with_dtype(DType t, F&& f) {
  switch (t) {
    case DType::F32: return f(float{});
    case DType::F64: return f(double{});
    case DType::I8: return f(int8_t{});
    case DType::U8: return f(uint8_t{});
    case DType::I32: return f(int32_t{});
    case DType::I64: return f(int64_t{});
    case DType::F16: case DType::BF16: return f(uint16_t{});
  }
}

void fill(void* p, size_t n, DType t, double v) {
  with_dtype(t, [&](auto z) {
    using T = decltype(z);
    T x;
    if (t == DType::F16) x = static_cast<T>(sdk::float_to_half(static_cast<float>(v)));
    else if (t == DType::BF16) x = static_cast<T>(sdk::float_to_bf16(static_cast<float>(v)));
    else x = static_cast<T>(v);
    std::fill(static_cast<T*>(p), static_cast<T*>(p) + n, x);
  });
}

// Index of the first element that is not `expect` (n when all are).
size_t find_mismatch(const void* p, size_t n, DType t, double expect, double* got) {
  size_t bad = n;
  with_dtype(t, [&](auto z) {
    using T = decltype(z);
    const T* a = static_cast<const T*>(p);
    for (size_t i = 0; i < n; ++i) {
      double v = t == DType::F16 ? sdk::half_to_float(static_cast<uint16_t>(a[i]))
                 : t == DType::BF16 ? sdk::bf16_to_float(static_cast<uint16_t>(a[i]))
                                   : static_cast<double>(a[i]);
      if (v != expect) {
        bad = i;
        *got = v;
        return;
      }
    }
  });
  return bad;
}

// ---------------------------------------------------------------- a rank

// One implementation under test: runs the op on the shared bench buffers.
struct Runner {
  std::string name;
  std::function<void(const Case&)> op;
  std::function<void()> barrier;
};

// The store as a barrier (outside every timed region).
void store_barrier(Store& s, const std::string& name, int rank, int world) {
  s.set(name + "/" + std::to_string(rank), std::string("1"));
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(name + "/" + std::to_string(r));
  s.wait(keys, std::chrono::minutes(5));
}

class Rank {
 public:
  Rank(const CollectivesOptions& o, const Plan& p, int rank, std::shared_ptr<Store> store)
      : o_(o), p_(p), rank_(rank), store_(std::move(store)) {}

  void run() {
    auto backend = PluginRegistry().load(o_.backend);
    CommOptions co;
    co.rank = rank_;
    co.world_size = p_.world;
    co.local_rank = rank_;
    co.local_world_size = p_.world;
    co.store = store_;
    co.config_toml = p_.config_toml;
    co.timeout = std::chrono::minutes(2);
    co.name = "bench";
    auto comm = backend->create_communicator(co);
#ifdef DTRAIN_BENCH_HAVE_GLOO
    std::unique_ptr<GlooReference> ref;
    if (p_.gloo_skip.empty())
      ref = std::make_unique<GlooReference>(rank_, p_.world, std::make_shared<PrefixStore>("rawgloo", store_),
                                            p_.gloo, std::chrono::minutes(2));
#endif
    size_t esz = dtype_size(p_.dtype);
    size_t max_bytes = p_.cases.back().bytes;
    Mem a = alloc_touched(max_bytes);
    Mem b = alloc_touched(p_.op == Op::Allgather ? max_bytes / p_.world : 0);
    a_ = a.get();
    b_ = p_.op == Op::Allgather ? b.get() : nullptr;
    DType t = p_.dtype;
    int n = p_.world;

    Runner dt{"dtrain", nullptr, nullptr};
    dt.op = [&](const Case& c) {
      switch (p_.op) {
        case Op::Allreduce: comm->allreduce(Buffer(a_, c.count, t), ReduceOp::Sum)->wait(); break;
        case Op::Broadcast: comm->broadcast(Buffer(a_, c.count, t), 0)->wait(); break;
        case Op::Allgather: comm->allgather(Buffer(b_, c.count, t), Buffer(a_, c.count * n, t))->wait(); break;
      }
    };
    bool has_barrier = backend->supports(DT_CAP_BARRIER);
    dt.barrier = [&] {
      if (has_barrier) {
        comm->barrier()->wait();
      } else {
        float x = 0;
        comm->allreduce(Buffer::of(&x, 1))->wait();
      }
    };
    std::vector<Runner*> runners;
#ifdef DTRAIN_BENCH_HAVE_GLOO
    auto raw_runner = [&](const std::string& name, GlooReference* g) {
      Runner r{name, nullptr, nullptr};
      r.op = [&, g](const Case& c) {
        switch (p_.op) {
          case Op::Allreduce: g->allreduce(a_, c.count, t); break;
          case Op::Broadcast: g->broadcast(a_, c.count * esz, 0); break;
          case Op::Allgather: g->allgather(b_, a_, c.count * esz); break;
        }
      };
      r.barrier = [g] { g->barrier(); };
      return r;
    };
    // --aa: dtrain's column is a second raw-Gloo context, so the ratios show
    // how far two identical implementations drift apart on this machine.
    std::unique_ptr<GlooReference> ref2;
    if (o_.aa && ref) {
      ref2 = std::make_unique<GlooReference>(rank_, p_.world, std::make_shared<PrefixStore>("rawgloo2", store_),
                                             p_.gloo, std::chrono::minutes(2));
      dt = raw_runner("dtrain", ref2.get());
    }
#endif
    if (!o_.no_dtrain) runners.push_back(&dt);
#ifdef DTRAIN_BENCH_HAVE_GLOO
    Runner gl{"gloo", nullptr, nullptr};
    if (ref) {
      gl = raw_runner("gloo", ref.get());
      runners.push_back(&gl);
    }
#endif

    if (runners.empty()) throw InvalidUsage("nothing to run: dtrain and the raw-Gloo reference are both off");
    for (size_t i = 0; i < p_.cases.size(); ++i) {
      const Case& c = p_.cases[i];
      if (!o_.no_check)
        for (auto* r : runners) check(*r, c);
      // Timed runs reduce zeros: the values stay finite and equal every iteration.
      std::memset(a_, 0, c.count * esz * (p_.op == Op::Allgather ? n : 1));
      if (b_) std::memset(b_, 0, c.count * esz);

      // Warm-up; rank 0 sizes the timed runs from the warm-up times.
      std::vector<double> warm;
      int nwarm = std::max(o_.warmup, p_.fixed_iters ? 0 : 1);
      for (int w = 0; w < nwarm; ++w) {
        auto t0 = Clock::now();
        runners[0]->op(c);
        warm.push_back(seconds_since(t0));
      }
      int iters = p_.fixed_iters, trials = o_.trials;
      std::string key = "iters/" + std::to_string(i), tkey = "trials/" + std::to_string(i);
      if (rank_ == 0) {
        // The fastest warm-up iteration: the first ones pay for cold caches
        // and connections.
        double fastest = warm.empty() ? 0 : std::max(*std::min_element(warm.begin(), warm.end()), 1e-7);
        if (!iters) iters = static_cast<int>(std::clamp(std::ceil(o_.target_ms / 1000.0 / fastest), 5.0, 1e6));
        // Many short trials: pairs of back-to-back trials cancel the machine's
        // drift, and the median of many pairs is what repeats.
        if (!trials)
          trials = fastest > 0 ? static_cast<int>(std::clamp(kTrialBudgetS / (2 * iters * fastest), 7.0, 61.0)) : 21;
        store_->set(key, std::to_string(iters));
        store_->set(tkey, std::to_string(trials));
      } else {
        iters = std::stoi(store_->get_string(key, std::chrono::minutes(5)));
        trials = std::stoi(store_->get_string(tkey, std::chrono::minutes(5)));
      }
      for (size_t r = 1; r < runners.size(); ++r)
        for (int w = 0; w < o_.warmup; ++w) runners[r]->op(c);

      // Trials alternate the implementations (and which one goes first), so
      // drift on a shared machine hits both alike.
      std::vector<std::vector<double>> times(runners.size());
      for (int trial = 0; trial < trials; ++trial) {
        for (size_t k = 0; k < runners.size(); ++k) {
          size_t r = trial % 2 ? runners.size() - 1 - k : k;
          runners[r]->barrier();
          auto t0 = Clock::now();
          for (int it = 0; it < iters; ++it) runners[r]->op(c);
          times[r].push_back(seconds_since(t0) / iters);
        }
      }
      for (size_t r = 0; r < runners.size(); ++r) {
        std::string v;
        for (double x : times[r]) v += fmt::format("{:.9e} ", x);
        store_->set(fmt::format("res/{}/{}/{}", runners[r]->name, i, rank_), v);
      }
      if (o_.verbose && rank_ == 0) {
        std::string line = fmt::format("[rank 0] {:>10} B  iters {:>6}", c.bytes, iters);
        for (size_t r = 0; r < runners.size(); ++r) {
          line += fmt::format("  {} us:", runners[r]->name);
          for (double x : times[r]) line += fmt::format(" {:.1f}", x * 1e6);
        }
        fmt::print(stderr, "{}\n", line);
      }
    }
    // Nobody tears down its connections while a peer may still read from them.
    store_barrier(*store_, "done", rank_, n);
  }

 private:
  [[noreturn]] void bad(const Runner& r, const Case& c, const std::string& what) {
    throw InternalError(fmt::format("{} {} of {} ({} x {}) gave wrong data: {}", r.name, op_name(p_.op),
                                    human_bytes(c.bytes), dtype_name(p_.dtype), c.count, what));
  }

  // One call with known inputs; every rank checks its whole result.
  void check(const Runner& r, const Case& c) {
    DType t = p_.dtype;
    int n = p_.world;
    double got = 0;
    size_t idx;
    switch (p_.op) {
      case Op::Allreduce: {
        fill(a_, c.count, t, rank_ % 3 + 1);
        double expect = 0;
        for (int q = 0; q < n; ++q) expect += q % 3 + 1;
        r.op(c);
        if ((idx = find_mismatch(a_, c.count, t, expect, &got)) != c.count)
          bad(r, c, fmt::format("element {} is {}, expected {}", idx, got, expect));
        break;
      }
      case Op::Broadcast:
        fill(a_, c.count, t, rank_ == 0 ? 7 : 0);
        r.op(c);
        if ((idx = find_mismatch(a_, c.count, t, 7, &got)) != c.count)
          bad(r, c, fmt::format("element {} is {}, expected 7", idx, got));
        break;
      case Op::Allgather: {
        fill(b_, c.count, t, rank_ % 100 + 1);
        fill(a_, c.count * n, t, 0);
        r.op(c);
        size_t esz = dtype_size(t);
        for (int q = 0; q < n; ++q)
          if ((idx = find_mismatch(a_ + q * c.count * esz, c.count, t, q % 100 + 1, &got)) != c.count)
            bad(r, c, fmt::format("block of rank {} element {} is {}, expected {}", q, idx, got, q % 100 + 1));
        break;
      }
    }
  }

  const CollectivesOptions& o_;
  const Plan& p_;
  int rank_;
  std::shared_ptr<Store> store_;
  char* a_ = nullptr;
  char* b_ = nullptr;
};

int worker_main(const CollectivesOptions& o, const Plan& p, const std::string& spec) {
  int rank = -1;
  try {
    // spec: rank:world:host:port
    auto c1 = spec.find(':'), c2 = spec.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) throw InvalidUsage("bad worker spec '" + spec + "'");
    rank = std::stoi(spec.substr(0, c1));
    int world = std::stoi(spec.substr(c1 + 1, c2 - c1 - 1));
    if (world != p.world) throw InvalidUsage("worker spec names another world size");
    auto [host, port] = parse_host_port(spec.substr(c2 + 1));
    const char* token = std::getenv(kTokenEnv);
    auto client = std::make_shared<TcpStore>(host, port, token ? token : "");
    auto store = std::make_shared<PrefixStore>("bench", client);
    Rank(o, p, rank, store).run();
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtrain-bench: rank {}: {}\n", rank, e.what());
    return 1;
  }
}

// ---------------------------------------------------------------- the parent

// CPU seconds all processes of the machine spent busy so far (/proc/stat).
double machine_busy_seconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  uint64_t user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(f >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq >> steal) || cpu != "cpu") return -1;
  return static_cast<double>(user + nice + sys + irq + softirq + steal) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// CPU seconds of this process and of its children reaped so far.
double own_cpu_seconds() {
  auto secs = [](const rusage& u) {
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
  };
  rusage self{}, kids{};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_CHILDREN, &kids);
  return secs(self) + secs(kids);
}

struct Row {
  Case c;
  int iters = 0, trials = 0;
  std::optional<double> dtrain, gloo, mpi;  // seconds per op (median trial)
  std::vector<double> dtrain_trials, gloo_trials;

  // dtrain against raw Gloo, trial by trial: trial k of both ran back to back,
  // so the machine's slow drift cancels out in each pair.
  std::optional<double> paired(bool ratio) const {
    size_t n = std::min(dtrain_trials.size(), gloo_trials.size());
    if (!n) return std::nullopt;
    std::vector<double> v;
    for (size_t k = 0; k < n; ++k)
      v.push_back(ratio ? gloo_trials[k] / dtrain_trials[k] : dtrain_trials[k] - gloo_trials[k]);
    return median(v);
  }
};

// Per trial the slowest rank; the median trial is the figure that repeats on a
// shared machine where single trials swing both ways.
std::vector<double> collect(Store& s, const std::string& impl, size_t i, int world) {
  std::vector<double> worst;
  for (int r = 0; r < world; ++r) {
    auto v = s.try_get(fmt::format("res/{}/{}/{}", impl, i, r));
    if (!v) return {};
    std::istringstream is(std::string(v->begin(), v->end()));
    double x;
    for (size_t t = 0; is >> x; ++t) {
      if (worst.size() <= t) worst.push_back(x);
      else worst[t] = std::max(worst[t], x);
    }
  }
  return worst;
}

// Runs dtrain-bench-mpi under mpirun; fills rows[*].mpi. Returns a note for the header.
std::string run_mpi(const CollectivesOptions& o, const Plan& p, std::vector<Row>& rows, std::chrono::seconds limit) {
  if (o.no_reference || o.no_mpi) return "turned off";
  if (p.dtype == DType::F16 || p.dtype == DType::BF16) return std::string("MPI has no ") + dtype_name(p.dtype) + " sum";
  std::string exe = dir_of(self_exe()) + "/dtrain-bench-mpi";
  struct stat st{};
  if (::stat(exe.c_str(), &st) != 0) return "skipped: " + exe + " was not built (MPI not found at build time)";
  std::string mpirun = find_in_path("mpirun");
  if (mpirun.empty()) return "skipped: mpirun is not on PATH (Debian: openmpi-bin)";
  std::vector<std::string> argv{mpirun, "-np", std::to_string(p.world), "--oversubscribe", "--bind-to", "none",
                                exe, "--op", op_name(p.op), "--dtype", dtype_name(p.dtype),
                                "--warmup", std::to_string(o.warmup), "--trials", std::to_string(o.trials)};
  for (auto& r : rows) {
    argv.push_back("--case");
    argv.push_back(fmt::format("{}:{}:{}:{}", r.c.bytes, r.c.count, r.iters, r.trials));
  }
  std::vector<std::string> env{"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                               "OMPI_MCA_btl_tcp_if_include=lo"};
  if (o.mpi_transport == "tcp") {
    env.push_back("OMPI_MCA_pml=ob1");
    env.push_back("OMPI_MCA_btl=self,tcp");
  } else if (o.mpi_transport == "sm") {
    env.push_back("OMPI_MCA_pml=ob1");
    env.push_back("OMPI_MCA_btl=self,vader");
  }
  Captured cap = run_capture(mpirun, argv, env, limit);
  std::map<size_t, double> got;
  std::istringstream is(cap.out);
  std::string line;
  while (std::getline(is, line)) {
    if (line.rfind(kMpiTag, 0) != 0) continue;
    size_t bytes = 0;
    double us = -1;
    std::istringstream ls(line.substr(std::strlen(kMpiTag)));
    std::string field;
    while (ls >> field) {
      auto eq = field.find('=');
      if (eq == std::string::npos) continue;
      std::string k = field.substr(0, eq), v = field.substr(eq + 1);
      if (k == "bytes") bytes = std::stoull(v);
      if (k == "time_us") us = std::stod(v);
    }
    if (bytes && us >= 0) got[bytes] = us * 1e-6;
  }
  for (auto& r : rows)
    if (got.count(r.c.bytes)) r.mpi = got[r.c.bytes];
  std::string what = o.mpi_transport.empty() ? "Open MPI's default transport" : "btl " + o.mpi_transport;
  if (!cap.failure.empty())
    return "FAILED (mpirun " + cap.failure + "; " + std::to_string(got.size()) + " of " +
           std::to_string(rows.size()) + " sizes measured), " + what;
  return what;
}

std::string fmt_time(std::optional<double> s) {
  if (!s) return "-";
  double us = *s * 1e6;
  return us < 1000 ? fmt::format("{:.2f}", us) : us < 1e6 ? fmt::format("{:.1f}", us) : fmt::format("{:.0f}", us);
}

std::string fmt_bw(std::optional<double> s, double bytes, double factor) {
  if (!s) return "-";
  return fmt::format("{:.3f}", bytes / *s / 1e9 * factor);
}

std::string fmt_ratio(std::optional<double> num_time, std::optional<double> den_time) {
  // busbw ratio = inverse time ratio (same bytes and factor)
  if (!num_time || !den_time) return "-";
  return fmt::format("{:.2f}", *den_time / *num_time);
}

void print_table(const CollectivesOptions& o, const Plan& p, const std::vector<Row>& rows, bool gloo_on,
                 bool mpi_on) {
  bool allreduce = p.op == Op::Allreduce;
  std::string title = o.aa ? "raw Gloo #2 (--aa)" : "dtrain (" + o.backend + ")";
  fmt::print("#\n");
  fmt::print("# {:>10} {:>10} {:>5} {:>5}  {:^32}  {:^18}  {:^18}  {:^13}  {:>8}\n", "", "", "", "",
             "--- " + title + " ---", gloo_on ? "--- raw Gloo ---" : "", mpi_on ? "--- Open MPI ---" : "",
             "busbw ratio", "latency");
  fmt::print("# {:>10} {:>10} {:>5} {:>5}  {:>10} {:>10} {:>10}  {:>10} {:>7}  {:>10} {:>7}  {:>6} {:>6}  {:>8}\n",
             "size(B)", "count", "type", "algo", "time(us)", "algbw", "busbw", "time(us)", "busbw", "time(us)",
             "busbw", "/gloo", "/mpi", "dt-gloo");
  fmt::print("# {:>10} {:>10} {:>5} {:>5}  {:>10} {:>10} {:>10}  {:>10} {:>7}  {:>10} {:>7}  {:>6} {:>6}  {:>8}\n",
             "", "", "", "", "", "(GB/s)", "(GB/s)", "", "(GB/s)", "", "(GB/s)", "", "", "(us)");
  for (auto& r : rows) {
    double bytes = static_cast<double>(r.c.bytes);
    std::string algo = allreduce && o.backend == "gloo" ? gloo_allreduce_algorithm(p.gloo, p.world, r.c.count * dtype_size(p.dtype)) : "-";
    std::string dlat = "-";
    if (r.c.bytes <= kSmallBytes && r.paired(false)) dlat = fmt::format("{:+.1f}", *r.paired(false) * 1e6);
    std::string gloo_ratio = r.paired(true) ? fmt::format("{:.2f}", *r.paired(true)) : "-";
    fmt::print("  {:>10} {:>10} {:>5} {:>5}  {:>10} {:>10} {:>10}  {:>10} {:>7}  {:>10} {:>7}  {:>6} {:>6}  {:>8}\n",
               r.c.bytes, r.c.count, dtype_name(p.dtype), algo, fmt_time(r.dtrain),
               fmt_bw(r.dtrain, bytes, 1), fmt_bw(r.dtrain, bytes, p.busbw_factor), fmt_time(r.gloo),
               fmt_bw(r.gloo, bytes, p.busbw_factor), fmt_time(r.mpi), fmt_bw(r.mpi, bytes, p.busbw_factor),
               gloo_ratio, fmt_ratio(r.dtrain, r.mpi), dlat);
  }
  fmt::print("#\n");
  if (!gloo_on) return;
  // Summary against raw Gloo: busbw ratio from 1 MiB, latency difference up to
  // 64 KiB. Single rows carry this machine's scheduling noise (see --aa), so
  // the targets are judged on the figure over all rows of a range, with its
  // 95% confidence interval from the spread between rows.
  std::vector<double> log_ratio, dlat;
  double min_ratio = 1e9, max_dlat = -1e9;
  size_t at_min = 0, at_max = 0;
  for (auto& r : rows) {
    if (!r.paired(true)) continue;
    if (r.c.bytes >= kLargeBytes) {
      double q = *r.paired(true);
      if (q < min_ratio) min_ratio = q, at_min = r.c.bytes;
      log_ratio.push_back(std::log(q));
    }
    if (r.c.bytes <= kSmallBytes) {
      double d = *r.paired(false) * 1e6;
      if (d > max_dlat) max_dlat = d, at_max = r.c.bytes;
      dlat.push_back(d);
    }
  }
  // Mean and the half-width of its 95% interval (Student's t: a range has few rows).
  auto mean_ci = [](const std::vector<double>& v) {
    static const double t975[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                  2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086};
    double m = 0, ss = 0;
    for (double x : v) m += x;
    m /= v.size();
    for (double x : v) ss += (x - m) * (x - m);
    size_t df = v.size() - 1;
    double t = df == 0 ? 0 : df <= 20 ? t975[df - 1] : 1.96;
    double half = df ? t * std::sqrt(ss / df / v.size()) : 0;
    return std::make_pair(m, half);
  };
  // The targets are those of the gloo backend's all-reduce.
  bool targets = allreduce && o.backend == "gloo" && !o.aa;
  std::string who = o.aa ? "raw Gloo (2nd)" : "dtrain";
  if (!log_ratio.empty()) {
    auto [m, h] = mean_ci(log_ratio);
    fmt::print("# {}/gloo busbw at >= 1 MiB: geometric mean {:.3f} (95% CI {:.3f}-{:.3f}), rows {:.3f} (at {}) .. {:.3f}{}\n",
               who, std::exp(m), std::exp(m - h), std::exp(m + h), min_ratio, human_bytes(at_min),
               std::exp(*std::max_element(log_ratio.begin(), log_ratio.end())),
               targets ? fmt::format("   [target >= 0.95: {}]", std::exp(m) >= 0.95 ? "met" : "NOT met") : "");
  }
  if (!dlat.empty()) {
    auto [m, h] = mean_ci(dlat);
    fmt::print("# {}-gloo latency at <= 64 KiB: mean {:+.1f} us (95% CI {:+.1f} .. {:+.1f}), rows {:+.1f} .. {:+.1f} (at {}){}\n",
               who, m, m - h, m + h, *std::min_element(dlat.begin(), dlat.end()), max_dlat, human_bytes(at_max),
               targets ? fmt::format("   [target <= 10 us: {}]", m <= 10 ? "met" : "NOT met") : "");
  }
}

int parent_main(const CollectivesOptions& o, const Plan& p, const std::vector<std::string>& argv) {
  install_interrupt_handlers();
  auto start = Clock::now();
  bool gloo_on = p.gloo_skip.empty();
  fmt::print("# dtrain-bench collectives: {} {}{}, {} ranks as processes on this host, backend '{}'{}\n",
             op_name(p.op), dtype_name(p.dtype), p.op == Op::Allreduce ? " (sum)" : "", p.world, o.backend,
             p.options_text.empty() ? "" : " with " + p.options_text);
  fmt::print("# sizes {} .. {} (x{}), warm-up {}, iterations {}, median of {} trial(s){}\n", human_bytes(p.cases.front().bytes),
             human_bytes(p.cases.back().bytes), o.step_factor, o.warmup,
             p.fixed_iters ? std::to_string(p.fixed_iters)
                           : fmt::format("auto (~{:g} ms per trial, >= 5)", o.target_ms),
             o.trials ? std::to_string(o.trials) : fmt::format("7-61 (~{:g} s per size)", kTrialBudgetS),
             gloo_on ? ", dtrain and raw Gloo trials interleaved" : "");
  if (o.aa)
    fmt::print("# A/A run (--aa): the dtrain columns are a second raw-Gloo context; their ratios to raw Gloo are "
               "this machine's noise\n");
  fmt::print("# time = average per op over a trial's iterations, slowest rank, median trial; "
             "algbw = size/time; busbw = algbw x {}\n",
             p.op == Op::Allreduce ? "2(n-1)/n" : p.op == Op::Allgather ? "(n-1)/n" : "1");
  fmt::print("# raw Gloo: {}\n",
             gloo_on ? "the gloo plugin's algorithm for each size called directly on a gloo::rendezvous::Context "
                       "(TCP on lo), same buffer and iterations"
                     : p.gloo_skip);
  if (gloo_on)
    fmt::print("# /gloo and dt-gloo: median over trial pairs (trial k of dtrain and of raw Gloo ran back to back) "
               "of raw time / dtrain time and of dtrain time - raw time\n");
  std::fflush(stdout);

  // Fail here, once, rather than in every rank.
  PluginRegistry().load(o.backend);
  std::string token = make_job_token();
  TcpStoreServer server("127.0.0.1", 0, token);
  std::string self = self_exe();
  double busy0 = machine_busy_seconds(), own0 = own_cpu_seconds();
  std::vector<Child> kids;
  fmt::print(stderr, "dtrain-bench: running {} ranks of dtrain{} ...\n", p.world, gloo_on ? " and raw Gloo" : "");
  for (int r = 0; r < p.world; ++r) {
    std::vector<std::string> env{
        fmt::format("{}={}:{}:{}:{}", kWorkerEnv, r, p.world, server.host(), server.port()),
        fmt::format("{}={}", kTokenEnv, token)};
    kids.push_back({spawn(self, argv, env), "rank " + std::to_string(r)});
  }
  std::string failure = wait_all(kids, std::chrono::seconds(o.time_limit_s));
  if (!failure.empty()) {
    fmt::print(stderr, "dtrain-bench: {}; the benchmark is incomplete\n", failure);
    return 1;
  }
  double t_ranks = seconds_since(start);
  // Other processes' CPU use during the timed phase: on a shared machine the
  // figures are only as good as this is small.
  double others = (machine_busy_seconds() - busy0 - (own_cpu_seconds() - own0)) / t_ranks;

  TcpStore client(server.host(), server.port(), token);
  PrefixStore store("bench", std::shared_ptr<Store>(&client, [](Store*) {}));
  std::vector<Row> rows;
  for (size_t i = 0; i < p.cases.size(); ++i) {
    Row r;
    r.c = p.cases[i];
    r.iters = std::stoi(store.get_string("iters/" + std::to_string(i), std::chrono::seconds(5)));
    r.trials = std::stoi(store.get_string("trials/" + std::to_string(i), std::chrono::seconds(5)));
    r.dtrain_trials = collect(store, "dtrain", i, p.world);
    if (gloo_on) r.gloo_trials = collect(store, "gloo", i, p.world);
    if (!r.dtrain_trials.empty()) r.dtrain = median(r.dtrain_trials);
    if (!r.gloo_trials.empty()) r.gloo = median(r.gloo_trials);
    rows.push_back(r);
  }

  auto mpi_start = Clock::now();
  auto left = std::chrono::seconds(std::max<int64_t>(30, o.time_limit_s - static_cast<int64_t>(t_ranks)));
  if (!o.no_reference && !o.no_mpi) fmt::print(stderr, "dtrain-bench: running Open MPI ...\n");
  std::string mpi_note = run_mpi(o, p, rows, left);
  if (interrupted()) {
    fmt::print(stderr, "dtrain-bench: interrupted\n");
    return 1;
  }
  bool mpi_on = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.mpi.has_value(); });
  fmt::print("# Open MPI: MPI_{}{} ({})\n",
             p.op == Op::Allreduce ? "Allreduce" : p.op == Op::Broadcast ? "Bcast" : "Allgather",
             p.op == Op::Allreduce ? " in place" : "", mpi_note);
  print_table(o, p, rows, gloo_on, mpi_on);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (busy0 >= 0)
    fmt::print("# other processes used {:.2f} of the {} CPUs during the dtrain/Gloo runs{}\n", std::max(others, 0.0),
               ncpu, others > 0.2 ? ": the figures are disturbed, compare ratios or rerun on a quiet machine" : "");
  fmt::print("# wall time: dtrain + raw Gloo {:.1f} s, Open MPI {:.1f} s\n", t_ranks, seconds_since(mpi_start));
  return mpi_note.rfind("FAILED", 0) == 0 ? 1 : 0;
}

}  // namespace

void add_collectives_options(CLI::App* sub, CollectivesOptions& o) {
  sub->add_option("--backend", o.backend, "backend plugin to benchmark (gloo, ucx, nccl, ...)")->required();
  sub->add_option("--world-size,-n", o.world_size, "number of ranks (processes on this host)")
      ->capture_default_str();
  sub->add_option("--op", o.op, "collective: allreduce, broadcast, allgather")->capture_default_str();
  sub->add_option("--dtype", o.dtype, "element type: f32, f64, f16, bf16, i8, u8, i32, i64")->capture_default_str();
  sub->add_option("--min-bytes,-b", o.min_bytes, "smallest size (K, M, G suffixes)")->capture_default_str();
  sub->add_option("--max-bytes,-e", o.max_bytes, "largest size")->capture_default_str();
  sub->add_option("--step-factor,-f", o.step_factor, "size multiplier between rows")->capture_default_str();
  sub->add_option("--iters", o.iters, "iterations per trial: 'auto' (from the warm-up time) or a number")
      ->capture_default_str();
  sub->add_option("--warmup", o.warmup, "untimed iterations per size and implementation")->capture_default_str();
  sub->add_option("--trials", o.trials,
                  "timed runs per size and implementation; the median counts (0: auto, 7 to 61 to fill about 1.2 s "
                  "per size)")
      ->capture_default_str();
  sub->add_option("--target-ms", o.target_ms, "with --iters auto: wall time of one trial")->capture_default_str();
  sub->add_option("--option,-o", o.options, "backend option key=value (repeatable), e.g. algorithm=ring");
  sub->add_flag("--no-reference", o.no_reference, "run neither raw Gloo nor Open MPI");
  sub->add_flag("--no-gloo", o.no_gloo, "leave out the raw-Gloo reference");
  sub->add_flag("--no-mpi", o.no_mpi, "leave out the Open MPI reference");
  sub->add_flag("--no-dtrain", o.no_dtrain, "run the references only (to profile them alone)")->group("");
  sub->add_flag("--aa", o.aa,
                "A/A run: a second raw-Gloo instance takes dtrain's place, to show how much the ratios drift "
                "between two identical implementations on this machine");
  sub->add_flag("--no-check", o.no_check, "skip the correctness check of each size");
  sub->add_option("--mpi-transport", o.mpi_transport, "Open MPI transport: tcp or sm (default: Open MPI's choice)")
      ->check(CLI::IsMember({"", "tcp", "sm"}));
  sub->add_option("--time-limit", o.time_limit_s, "seconds before the ranks are killed")->capture_default_str();
  sub->add_flag("--verbose,-v", o.verbose, "print each size's timings as it finishes (stderr)");
}

int run_collectives(const CollectivesOptions& o, const std::vector<std::string>& argv) {
  Plan p;
  try {
    p = make_plan(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtrain-bench: {}\n", e.what());
    return 2;
  }
  if (const char* spec = std::getenv(kWorkerEnv)) return worker_main(o, p, spec);
  try {
    return parent_main(o, p, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtrain-bench: {}\n", e.what());
    return 1;
  }
}

}  // namespace dtrain::bench
