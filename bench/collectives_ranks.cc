// `dtrain-bench collectives`: one rank (a process started by the parent) running dtrain and raw Gloo.
#include "collectives_internal.h"
#include "collectives_turns.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/communicator.h"
#include "dtrain/endpoint.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/sdk/half.h"
#include "dtrain/work.h"
#ifdef DTRAIN_BENCH_HAVE_NCCL
#include "nccl_reference.h"
#endif

namespace dtrain::bench::coll {

namespace {

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
    case DType::F16:
    case DType::BF16: return f(uint16_t{});
  }
}

void fill(void* p, size_t n, DType t, double v) {
  with_dtype(t, [&](auto z) {
    using T = decltype(z);
    T x;
    if (t == DType::F16)
      x = static_cast<T>(sdk::float_to_half(static_cast<float>(v)));
    else if (t == DType::BF16)
      x = static_cast<T>(sdk::float_to_bf16(static_cast<float>(v)));
    else
      x = static_cast<T>(v);
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
      double v = t == DType::F16    ? sdk::half_to_float(static_cast<uint16_t>(a[i]))
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

// One implementation under test: runs the op on the shared bench buffers.
struct Runner {
  std::string name;
  std::function<void(const Case&)> op;
  std::function<void()> barrier;
};

class Rank {
 public:
  // turn_store: set when Open MPI's ranks run beside these and take turns
  // with them (collectives_turns.h); a connection of its own.
  Rank(const CollectivesOptions& o, const Plan& p, int rank, std::shared_ptr<Store> store,
       std::shared_ptr<Store> turn_store)
      : o_(o), p_(p), rank_(rank), store_(std::move(store)) {
    if (turn_store)
      turns_ = std::make_unique<Turns>(std::move(turn_store), Side::Dtrain, rank, p.world,
                                       std::chrono::seconds(o.time_limit_s));
  }

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
    Device dev;
    void* stream = nullptr;
#ifdef DTRAIN_BENCH_HAVE_NCCL
    // --backend nccl: CUDA buffers on this rank's device and one stream, which
    // dtrain's ops and raw NCCL's share.
    std::unique_ptr<CudaArena> cuda;
    if (p_.cuda) {
      int d = p_.cuda_device >= 0 ? p_.cuda_device : rank_ % cuda_devices_or_throw();
      if (p_.cuda_device < 0) co.config_toml += fmt::format("device = {}\n", d);
      cuda = std::make_unique<CudaArena>(d);
      cuda_ = cuda.get();
      dev = Device::cuda(d);
      stream = cuda->stream();
    }
#endif
    auto comm = backend->create_communicator(co);
#ifdef DTRAIN_BENCH_HAVE_GLOO
    std::unique_ptr<GlooReference> ref;
    if (p_.gloo_skip.empty())
      ref = std::make_unique<GlooReference>(rank_, p_.world, std::make_shared<PrefixStore>("rawgloo", store_), p_.gloo,
                                            std::chrono::minutes(2));
#endif
    [[maybe_unused]] size_t esz = dtype_size(p_.dtype);
    size_t max_bytes = p_.cases.back().bytes;
    Mem a = alloc_touched(max_bytes);
    Mem b = alloc_touched(p_.op == Op::Allgather ? max_bytes / p_.world : 0);
    a_ = ha_ = a.get();
    b_ = hb_ = p_.op == Op::Allgather ? b.get() : nullptr;
#ifdef DTRAIN_BENCH_HAVE_NCCL
    if (cuda_) {
      // The host blocks stay as the correctness check's copies.
      a_ = static_cast<char*>(cuda_->alloc(max_bytes));
      b_ = p_.op == Op::Allgather ? static_cast<char*>(cuda_->alloc(max_bytes / p_.world)) : nullptr;
    }
#endif
    [[maybe_unused]] DType t = p_.dtype;
    int n = p_.world;

    Runner dt = dtrain_runner(comm, backend->supports(DT_CAP_BARRIER), dev, stream);
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

#ifdef DTRAIN_BENCH_HAVE_NCCL
    // Raw NCCL: a communicator of its own on the same device, buffers and stream.
    auto nccl_op = [&](NcclReference* g) {
      return [&, g](const Case& c) {
        switch (p_.op) {
          case Op::Allreduce: g->allreduce(a_, c.count, t); break;
          case Op::Broadcast: g->broadcast(a_, c.count, t, 0); break;
          case Op::Allgather: g->allgather(b_, a_, c.count, t); break;
        }
      };
    };
    std::unique_ptr<NcclReference> nref;
    Runner nc{"nccl", nullptr, nullptr};
    if (cuda_ && p_.nccl_skip.empty()) {
      nref = std::make_unique<NcclReference>(rank_, p_.world, *cuda_, std::make_shared<PrefixStore>("rawnccl", store_),
                                             std::chrono::minutes(2));
      nc.op = nccl_op(nref.get());
      nc.barrier = [g = nref.get()] { g->barrier(); };
      runners.push_back(&nc);
    }
    // --aa: dtrain's column is a second raw-NCCL communicator (the noise floor).
    std::unique_ptr<NcclReference> nref2;
    if (o_.aa && nref) {
      nref2 = std::make_unique<NcclReference>(
          rank_, p_.world, *cuda_, std::make_shared<PrefixStore>("rawnccl2", store_), std::chrono::minutes(2));
      dt.op = nccl_op(nref2.get());
      dt.barrier = [g = nref2.get()] { g->barrier(); };
    }
#endif
    if (runners.empty()) throw InvalidUsage("nothing to run: dtrain and every reference are off");
    for (size_t i = 0; i < p_.cases.size(); ++i) measure(runners, i);
    // Nobody tears down its connections while a peer may still read from them.
    store_barrier(*store_, "done", rank_, n);
  }

 private:
  // dtrain's communicator as the implementation under test.
  Runner dtrain_runner(std::shared_ptr<Communicator> comm, bool has_barrier, Device dev, void* stream) {
    // Blocking calls return a finished work: its wait() only reads its state.
    CallOptions call;
    call.blocking = !o_.async;
    Runner dt{"dtrain", nullptr, nullptr};
    dt.op = [this, comm, call, dev, stream](const Case& c) {
      const DType t = p_.dtype;
      switch (p_.op) {
        case Op::Allreduce: comm->allreduce(Buffer(a_, c.count, t, dev, stream), ReduceOp::Sum, call)->wait(); break;
        case Op::Broadcast: comm->broadcast(Buffer(a_, c.count, t, dev, stream), 0, call)->wait(); break;
        case Op::Allgather:
          comm->allgather(Buffer(b_, c.count, t, dev, stream), Buffer(a_, c.count * p_.world, t, dev, stream), call)
              ->wait();
          break;
      }
    };
    dt.barrier = [comm, has_barrier] {
      if (has_barrier) {
        comm->barrier()->wait();
      } else {
        float x = 0;
        comm->allreduce(Buffer::of(&x, 1))->wait();
      }
    };
    return dt;
  }

  // Size i on every runner: the check, the warm-up, the timed trials (taking
  // turns with Open MPI's ranks when they run beside these); the times go to
  // the store for the parent.
  void measure(const std::vector<Runner*>& runners, size_t i) {
    const Case& c = p_.cases[i];
    const size_t esz = dtype_size(p_.dtype);
    if (turns_) turns_->before(Side::Dtrain);  // this size's set-up slot
    if (!o_.no_check)
      for (auto* r : runners) check(*r, c);
    // Timed runs reduce zeros: the values stay finite and equal every iteration.
    zero(a_, c.count * esz * (p_.op == Op::Allgather ? p_.world : 1));
    if (b_) zero(b_, c.count * esz);

    // Warm-up of every implementation, timed: each one's iterations per trial
    // come from its own fastest warm-up call (raw Gloo's 8 B op is ~1000x
    // dtrain-ucx's, so one count for both would run Gloo for hours).
    int nwarm = std::max(o_.warmup, p_.fixed_iters ? 0 : 1);
    std::vector<double> fastest(runners.size(), 0);
    for (size_t r = 0; r < runners.size(); ++r)
      for (int w = 0; w < nwarm; ++w) {
        auto t0 = Clock::now();
        runners[r]->op(c);
        double s = seconds_since(t0);
        fastest[r] = w ? std::min(fastest[r], s) : s;
      }
    auto [iters, trials] = iters_and_trials(i, runners, fastest);
    // Trials alternate the implementations (and which one goes first), so
    // drift on a shared machine hits both alike; Open MPI's trials take
    // their slots in the same order (schedule()).
    std::vector<std::vector<double>> times(runners.size());
    auto run_trial = [&, &iters = iters](int trial) {
      for (size_t k = 0; k < runners.size(); ++k) {
        size_t r = trial % 2 ? runners.size() - 1 - k : k;
        if (trial > 0) iters[r] = resized(i, trial, *runners[r], iters[r], times[r].back());
        runners[r]->barrier();
        auto t0 = Clock::now();
        for (int it = 0; it < iters[r]; ++it) runners[r]->op(c);
        times[r].push_back(seconds_since(t0) / iters[r]);
      }
    };
    if (turns_) {
      auto slots = schedule(trials);
      for (size_t j = 1; j < slots.size(); ++j) {
        turns_->before(slots[j]);
        if (slots[j] == Side::Dtrain) run_trial(trial_of_slot(j));
      }
    } else {
      for (int trial = 0; trial < trials; ++trial) run_trial(trial);
    }
    publish(runners, i, iters, times);
  }

  // Iterations per trial of each runner and trials of size i: rank 0 decides
  // from the fastest warm-up calls (unless fixed on the command line), the
  // others read them. Keys: iters/<i> (the first runner's, for the table),
  // iters/<i>/<runner>, trials/<i>.
  std::pair<std::vector<int>, int> iters_and_trials(size_t i, const std::vector<Runner*>& runners,
                                                    const std::vector<double>& fastest) {
    std::vector<int> iters(runners.size(), p_.fixed_iters);
    int trials = o_.trials;
    std::string key = "iters/" + std::to_string(i), tkey = "trials/" + std::to_string(i);
    if (rank_ != 0) {
      for (size_t r = 0; r < runners.size(); ++r)
        iters[r] = std::stoi(store_->get_string(key + "/" + runners[r]->name, std::chrono::minutes(5)));
      return {iters, std::stoi(store_->get_string(tkey, std::chrono::minutes(5)))};
    }
    // The fastest warm-up iteration: the first ones pay for cold caches and
    // connections. A trial's expected time: its iterations of that call.
    const double target_s = o_.target_ms / 1000.0;
    double round_s = 0;
    for (size_t r = 0; r < runners.size(); ++r) {
      double f = std::max(fastest[r], 1e-7);
      if (!iters[r]) iters[r] = static_cast<int>(std::clamp(std::ceil(target_s / f), 5.0, 1e6));
      round_s += iters[r] * f;
    }
    // Open MPI's ranks, when they run beside these, size their own trials
    // (bench/mpi_main.cc) to about the target.
    if (turns_) round_s += p_.fixed_iters ? p_.fixed_iters * std::max(fastest[0], 1e-7) : target_s;
    // Many short trials: pairs of back-to-back trials cancel the machine's
    // drift, and the median of many pairs is what repeats.
    if (!trials) trials = fastest[0] > 0 ? static_cast<int>(std::clamp(kTrialBudgetS / round_s, 7.0, 61.0)) : 21;
    for (size_t r = 0; r < runners.size(); ++r) store_->set(key + "/" + runners[r]->name, std::to_string(iters[r]));
    store_->set(key, std::to_string(iters[0]));
    store_->set(tkey, std::to_string(trials));
    return {iters, trials};
  }

  // Iterations of a runner's next trial (auto only): rank 0 cuts them to the
  // target when the last trial ran over 4x it (the warm-up can be fast and the
  // trials slow: two busy-polling ranks that the scheduler put on one core
  // take a time slice per op, ~1000x their own time), and publishes them as
  // iters/<i>/<runner>/<trial> for the others. One slow trial, then the rest
  // are the target's length again.
  int resized(size_t i, int trial, const Runner& r, int iters, double last_per_op) {
    if (p_.fixed_iters) return iters;
    std::string key = fmt::format("iters/{}/{}/{}", i, r.name, trial);
    if (rank_ != 0) return std::stoi(store_->get_string(key, std::chrono::seconds(o_.time_limit_s)));
    const double target_s = o_.target_ms / 1000.0;
    if (iters > 5 && iters * last_per_op > 4 * target_s)
      iters = static_cast<int>(std::clamp(std::ceil(target_s / last_per_op), 5.0, 1e6));
    store_->set(key, std::to_string(iters));
    return iters;
  }

  // This rank's times of size i into the store (and, --verbose, rank 0's to stderr).
  void publish(const std::vector<Runner*>& runners, size_t i, const std::vector<int>& iters,
               const std::vector<std::vector<double>>& times) {
    for (size_t r = 0; r < runners.size(); ++r) {
      std::string v;
      for (double x : times[r]) v += fmt::format("{:.9e} ", x);
      store_->set(fmt::format("res/{}/{}/{}", runners[r]->name, i, rank_), v);
    }
    if (o_.verbose && rank_ == 0) {
      std::string line = fmt::format("[rank 0] {:>10} B", p_.cases[i].bytes);
      for (size_t r = 0; r < runners.size(); ++r) {
        line += fmt::format("  {} x{} us:", runners[r]->name, iters[r]);
        for (double x : times[r]) line += fmt::format(" {:.1f}", x * 1e6);
      }
      fmt::print(stderr, "{}\n", line);
    }
  }

  [[noreturn]] void bad(const Runner& r, const Case& c, const std::string& what) {
    throw InternalError(fmt::format("{} {} of {} ({} x {}) gave wrong data: {}", r.name, op_name(p_.op),
                                    human_bytes(c.bytes), dtype_name(p_.dtype), c.count, what));
  }

  // One call with known inputs; every rank checks its whole result.
  void check(const Runner& r, const Case& c) {
    DType t = p_.dtype;
    int n = p_.world;
    size_t esz = dtype_size(t);
    double got = 0;
    size_t idx;
    switch (p_.op) {
      case Op::Allreduce: {
        fill(ha_, c.count, t, rank_ % 3 + 1);
        push(a_, ha_, c.count * esz);
        double expect = 0;
        for (int q = 0; q < n; ++q) expect += q % 3 + 1;
        r.op(c);
        pull(ha_, a_, c.count * esz);
        if ((idx = find_mismatch(ha_, c.count, t, expect, &got)) != c.count)
          bad(r, c, fmt::format("element {} is {}, expected {}", idx, got, expect));
        break;
      }
      case Op::Broadcast:
        fill(ha_, c.count, t, rank_ == 0 ? 7 : 0);
        push(a_, ha_, c.count * esz);
        r.op(c);
        pull(ha_, a_, c.count * esz);
        if ((idx = find_mismatch(ha_, c.count, t, 7, &got)) != c.count)
          bad(r, c, fmt::format("element {} is {}, expected 7", idx, got));
        break;
      case Op::Allgather: {
        fill(hb_, c.count, t, rank_ % 100 + 1);
        fill(ha_, c.count * n, t, 0);
        push(b_, hb_, c.count * esz);
        push(a_, ha_, c.count * n * esz);
        r.op(c);
        pull(ha_, a_, c.count * n * esz);
        for (int q = 0; q < n; ++q)
          if ((idx = find_mismatch(ha_ + q * c.count * esz, c.count, t, q % 100 + 1, &got)) != c.count)
            bad(r, c, fmt::format("block of rank {} element {} is {}, expected {}", q, idx, got, q % 100 + 1));
        break;
      }
    }
  }

  // The op's memory (CUDA with --backend nccl) from and to the host copies
  // the check fills and reads; no-ops where both are host memory.
  void push(char* dst, const char* host, size_t bytes) {
#ifdef DTRAIN_BENCH_HAVE_NCCL
    if (cuda_) cuda_->upload(dst, host, bytes);
#endif
    (void)dst, (void)host, (void)bytes;
  }
  void pull(char* host, const char* src, size_t bytes) {
#ifdef DTRAIN_BENCH_HAVE_NCCL
    if (cuda_) cuda_->download(host, src, bytes);
#endif
    (void)host, (void)src, (void)bytes;
  }
  void zero(char* dst, size_t bytes) {
#ifdef DTRAIN_BENCH_HAVE_NCCL
    if (cuda_) return cuda_->zero(dst, bytes);
#endif
    std::memset(dst, 0, bytes);
  }

  const CollectivesOptions& o_;
  const Plan& p_;
  int rank_;
  std::shared_ptr<Store> store_;
  char* a_ = nullptr;  // the op's buffers
  char* b_ = nullptr;
  char* ha_ = nullptr;  // their host copies (the same blocks without CUDA)
  char* hb_ = nullptr;
#ifdef DTRAIN_BENCH_HAVE_NCCL
  CudaArena* cuda_ = nullptr;
#endif
  std::unique_ptr<Turns> turns_;
};

}  // namespace

void store_barrier(Store& s, const std::string& name, int rank, int world) {
  s.set(name + "/" + std::to_string(rank), std::string("1"));
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(name + "/" + std::to_string(r));
  s.wait(keys, std::chrono::minutes(5));
}

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
    std::shared_ptr<Store> turn_store;
    if (std::getenv(kMpiPairedEnv))
      turn_store = std::make_shared<PrefixStore>("bench", std::make_shared<TcpStore>(host, port, token ? token : ""));
    Rank(o, p, rank, store, turn_store).run();
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtrain-bench: rank {}: {}\n", rank, e.what());
    return 1;
  }
}

}  // namespace dtrain::bench::coll
