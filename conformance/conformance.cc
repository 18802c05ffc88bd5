#include "conformance.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/sdk/cuda_runtime.h"
#include "dtrain/sdk/support.h"

namespace dtrain::conformance {

namespace {

const DType kTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32, DType::I64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod};

bool is_signed(DType t) { return t != DType::U8; }

// The device of this thread's run (one rank per thread): -1 = host memory.
int& tls_cuda_device() {
  thread_local int d = -1;
  return d;
}

// The payload of rank r at global index i for the ops that move data without
// arithmetic: small integers, exact in every dtype, distinct across ranks.
double payload(int r, size_t i, DType t) {
  double v = static_cast<double>((i * 7 + static_cast<size_t>(r) * 13) % 23);
  return is_signed(t) ? v - 11.0 : v;
}

// What rank r of n contributes to a reduction at index i. Every result, and
// every partial result in any order a plugin may add or multiply in, is exact
// and representable in every dtype at any world size (MPI and NCCL leave
// overflow undefined): |sum| <= 121 (int8 holds 127, bf16 integers are exact
// to 256; uint8 sums stay in [0, 242]) and a product is at most 2^6 (int8: 127).
// Up to 11 ranks (12 for products) the values are payload()'s (products: 1 or
// 2 alternating); beyond, the magnitude shrinks with n and then only every
// k-th rank contributes, the others giving 0 (a sum's identity) or 1.
double contribution(int n, int r, size_t i, DType t, ReduceOp op) {
  if (op == ReduceOp::Max || op == ReduceOp::Min) return payload(r, i, t);
  if (op == ReduceOp::Prod) {
    const int stride = (n + 11) / 12;
    if (r % stride) return 1.0;
    return 1.0 + static_cast<double>((i + static_cast<size_t>(r / stride)) % 2);
  }
  const int magnitude = std::max(1, 121 / std::max(n, 11));
  const int stride = (n + 120) / 121;
  if (r % stride) return 0.0;
  double v = std::round((static_cast<double>((i * 7 + static_cast<size_t>(r) * 13) % 23) - 11.0) * magnitude / 11.0);
  return is_signed(t) ? v : v + magnitude;
}

double read(const void* p, size_t i, DType t) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::F16: return sdk::half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::BF16: return sdk::bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::I8: return static_cast<const int8_t*>(p)[i];
    case DType::U8: return static_cast<const uint8_t*>(p)[i];
    case DType::I32: return static_cast<const int32_t*>(p)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

void write(void* p, size_t i, DType t, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::F64: static_cast<double*>(p)[i] = v; return;
    case DType::F16: static_cast<uint16_t*>(p)[i] = sdk::float_to_half(static_cast<float>(v)); return;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = sdk::float_to_bf16(static_cast<float>(v)); return;
    case DType::I8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); return;
    case DType::U8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); return;
    case DType::I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DType::I64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
  }
}

double reduce_expected(int n, size_t i, DType t, ReduceOp op) {
  double acc = contribution(n, 0, i, t, op);
  for (int r = 1; r < n; ++r) {
    double v = contribution(n, r, i, t, op);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Prod: acc *= v; break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
    }
  }
  if (op == ReduceOp::Avg) acc = is_floating(t) ? acc / n : std::trunc(acc / n);
  return acc;
}

double tolerance(DType t, ReduceOp op) {
  if (op != ReduceOp::Avg || !is_floating(t)) return 0;
  switch (t) {
    case DType::F16: return 1e-3;
    case DType::BF16: return 8e-3;
    case DType::F32: return 1e-6;
    default: return 1e-12;
  }
}

// A case's buffer: filled and checked in host memory; on CUDA runs
// (Options::cuda_device >= 0) buf() uploads it to device memory and the
// first data() after that downloads the result.
struct HostBuffer {
  std::vector<uint8_t> bytes;
  DType t;
  size_t n;
  int device = -1;
  void* dev = nullptr;
  bool on_device = false;
  HostBuffer(size_t count, DType type, int cuda_device = tls_cuda_device())
      : bytes(take(std::max<size_t>(count * dtype_size(type), 1))), t(type), n(count), device(cuda_device) {}
  HostBuffer(HostBuffer&& o) noexcept
      : bytes(std::move(o.bytes)), t(o.t), n(o.n), device(o.device), dev(o.dev), on_device(o.on_device) {
    o.dev = nullptr;
  }
  HostBuffer(const HostBuffer&) = delete;
  ~HostBuffer() {
    if (dev) sdk::cuda::runtime().Free(dev);
    if (bytes.capacity() && pool().size() < 4) pool().push_back(std::move(bytes));
  }
  // This thread's freed buffers, reused: the large cases' fresh buffers
  // otherwise cost a page fault per 4 KiB, every case.
  static std::vector<std::vector<uint8_t>>& pool() {
    thread_local std::vector<std::vector<uint8_t>> p;
    return p;
  }
  static std::vector<uint8_t> take(size_t size) {
    auto& p = pool();
    auto best = p.end();
    for (auto it = p.begin(); it != p.end(); ++it)
      if (it->capacity() >= size && (best == p.end() || it->capacity() < best->capacity())) best = it;
    std::vector<uint8_t> v;
    if (best != p.end()) {
      v = std::move(*best);
      p.erase(best);
    }
    v.assign(size, 0xA5);
    return v;
  }
  void* data() {
    if (on_device) {
      const auto& rt = sdk::cuda::runtime();
      rt.check(rt.Memcpy(bytes.data(), dev, n * dtype_size(t), sdk::cuda::kMemcpyDeviceToHost),
               "cudaMemcpy of a result to the host");
      on_device = false;
    }
    return bytes.data();
  }
  Buffer buf() {
    if (device < 0) return Buffer(n ? data() : nullptr, n, t);
    const auto& rt = sdk::cuda::require_device(device);
    sdk::cuda::DeviceGuard g(rt, device);
    if (!dev) rt.check(rt.Malloc(&dev, bytes.size()), "cudaMalloc of " + std::to_string(bytes.size()) + " bytes");
    rt.check(rt.Memcpy(dev, data(), bytes.size(), sdk::cuda::kMemcpyHostToDevice), "cudaMemcpy to the device");
    on_device = true;
    return Buffer(n ? dev : nullptr, n, t, Device::cuda(device));
  }
};

// payload() and contribution() depend on i only through i % 23 and i % 2, so every expectation
// below is periodic in i with this period: fill() and check() evaluate it
// once per period (the large cases are 4M elements per rank).
constexpr size_t kPeriod = 46;

// p[i] = v(i) for i in [0, n); v must have period kPeriod.
template <typename F>
void fill(void* p, size_t n, DType t, F&& v) {
  const size_t es = dtype_size(t), k = std::min(n, kPeriod);
  for (size_t i = 0; i < k; ++i) write(p, i, t, v(i));
  auto* b = static_cast<uint8_t*>(p);
  for (size_t done = k; done < n;) {
    size_t len = std::min(done, n - done);
    std::memcpy(b + done * es, b, len * es);
    done += len;
  }
}

template <typename T, typename Read>
size_t first_mismatch(const void* got, size_t n, double tol, const double* expect, Read rd) {
  const T* g = static_cast<const T*>(got);
  for (size_t i = 0, j = 0; i < n; ++i, j = j + 1 == kPeriod ? 0 : j + 1) {
    double e = expect[j], v = rd(g[i]);
    if (tol == 0 ? v != e : std::fabs(v - e) > tol * std::max(1.0, std::fabs(e))) return i;
  }
  return n;
}

// Compares got[i] with expect(i) for i in [0, n); expect must have period
// kPeriod. Returns "" or the first mismatch.
template <typename F>
std::string check(const void* got, size_t n, DType t, double tol, F&& expect) {
  double e[kPeriod];
  for (size_t j = 0; j < std::min(n, kPeriod); ++j) e[j] = expect(j);
  auto as_double = [](auto x) { return static_cast<double>(x); };
  size_t bad = n;
  switch (t) {
    case DType::F32: bad = first_mismatch<float>(got, n, tol, e, as_double); break;
    case DType::F64: bad = first_mismatch<double>(got, n, tol, e, as_double); break;
    case DType::F16:
      bad = first_mismatch<uint16_t>(got, n, tol, e, [](uint16_t x) { return double(sdk::half_to_float(x)); });
      break;
    case DType::BF16:
      bad = first_mismatch<uint16_t>(got, n, tol, e, [](uint16_t x) { return double(sdk::bf16_to_float(x)); });
      break;
    case DType::I8: bad = first_mismatch<int8_t>(got, n, tol, e, as_double); break;
    case DType::U8: bad = first_mismatch<uint8_t>(got, n, tol, e, as_double); break;
    case DType::I32: bad = first_mismatch<int32_t>(got, n, tol, e, as_double); break;
    case DType::I64: bad = first_mismatch<int64_t>(got, n, tol, e, as_double); break;
  }
  if (bad == n) return "";
  std::ostringstream os;
  os << "element " << bad << " is " << read(got, bad, t) << ", expected " << e[bad % kPeriod];
  return os.str();
}

// check() on each of n blocks of c elements: block j against expect(j, i).
template <typename F>
std::string check_blocks(const void* got, size_t c, int n, DType t, F&& expect) {
  for (int j = 0; j < n; ++j) {
    std::string e = check(static_cast<const uint8_t*>(got) + j * c * dtype_size(t), c, t, 0,
                          [&](size_t i) { return expect(j, i); });
    if (!e.empty()) return "block " + std::to_string(j) + ": " + e;
  }
  return "";
}

struct Case {
  std::string name;
  uint64_t cap;
  std::function<std::string()> body;  // "" on success
};

std::vector<Case> make_cases(Communicator& comm, const Options& o) {
  const int n = comm.size(), me = comm.rank();
  std::vector<size_t> counts = {0, 1, 1001, o.large_count};
  std::vector<Case> cases;
  int iteration = 0;
  for (size_t c : counts) {
    for (DType t : kTypes) {
      std::string suffix = std::string("/") + dtype_name(t);
      std::string nc = "/n=" + std::to_string(c);
      for (ReduceOp op : kOps) {
        std::string on = std::string("/") + to_string(op);
        cases.push_back({"allreduce" + suffix + on + nc, DT_CAP_ALLREDUCE, [&comm, c, t, op, n, me] {
                           HostBuffer b(c, t);
                           fill(b.data(), c, t, [&](size_t i) { return contribution(n, me, i, t, op); });
                           comm.allreduce(b.buf(), op)->wait();
                           return check(b.data(), c, t, tolerance(t, op),
                                        [&](size_t i) { return reduce_expected(n, i, t, op); });
                         }});
        int root = iteration++ % n;
        cases.push_back({"reduce" + suffix + on + nc + "/root=" + std::to_string(root), DT_CAP_REDUCE,
                         [&comm, c, t, op, n, me, root] {
                           HostBuffer s(c, t), r(me == root ? c : 0, t);
                           fill(s.data(), c, t, [&](size_t i) { return contribution(n, me, i, t, op); });
                           comm.reduce(s.buf(), r.buf(), op, root)->wait();
                           if (me != root) return std::string();
                           return check(r.data(), c, t, tolerance(t, op),
                                        [&](size_t i) { return reduce_expected(n, i, t, op); });
                         }});
        cases.push_back({"reduce_scatter" + suffix + on + nc, DT_CAP_REDUCE_SCATTER, [&comm, c, t, op, n, me] {
                           HostBuffer s(c * n, t), r(c, t);
                           fill(s.data(), c * n, t, [&](size_t i) { return contribution(n, me, i, t, op); });
                           comm.reduce_scatter(s.buf(), r.buf(), op)->wait();
                           return check(r.data(), c, t, tolerance(t, op),
                                        [&](size_t i) { return reduce_expected(n, me * c + i, t, op); });
                         }});
      }
      cases.push_back(
          {"allreduce_out_of_place" + suffix + nc, DT_CAP_ALLREDUCE, [&comm, c, t, n, me] {
             HostBuffer s(c, t), r(c, t);
             fill(s.data(), c, t, [&](size_t i) { return contribution(n, me, i, t, ReduceOp::Sum); });
             comm.allreduce(s.buf(), r.buf(), ReduceOp::Sum)->wait();
             std::string e =
                 check(r.data(), c, t, 0, [&](size_t i) { return reduce_expected(n, i, t, ReduceOp::Sum); });
             if (!e.empty()) return e;
             return check(s.data(), c, t, 0, [&](size_t i) { return contribution(n, me, i, t, ReduceOp::Sum); }).empty()
                        ? std::string()
                        : std::string("the send buffer was modified");
           }});
      int root = iteration++ % n;
      cases.push_back(
          {"broadcast" + suffix + nc + "/root=" + std::to_string(root), DT_CAP_BROADCAST, [&comm, c, t, me, root] {
             HostBuffer b(c, t);
             if (me == root) fill(b.data(), c, t, [&](size_t i) { return payload(root, i, t); });
             comm.broadcast(b.buf(), root)->wait();
             return check(b.data(), c, t, 0, [&](size_t i) { return payload(root, i, t); });
           }});
      cases.push_back({"allgather" + suffix + nc, DT_CAP_ALLGATHER, [&comm, c, t, n, me] {
                         HostBuffer s(c, t), r(c * n, t);
                         fill(s.data(), c, t, [&](size_t i) { return payload(me, i, t); });
                         comm.allgather(s.buf(), r.buf())->wait();
                         return check_blocks(r.data(), c, n, t, [&](int j, size_t i) { return payload(j, i, t); });
                       }});
      cases.push_back({"alltoall" + suffix + nc, DT_CAP_ALLTOALL, [&comm, c, t, n, me] {
                         HostBuffer s(c * n, t), r(c * n, t);
                         fill(s.data(), c * n, t, [&](size_t i) { return payload(me, i, t); });
                         comm.alltoall(s.buf(), r.buf())->wait();
                         // Block j of rank i's send is block i of rank j's recv.
                         return check_blocks(r.data(), c, n, t,
                                             [&](int j, size_t i) { return payload(j, me * c + i, t); });
                       }});
      if (n > 1) {
        cases.push_back({"sendrecv_ring" + suffix + nc, DT_CAP_SENDRECV, [&comm, c, t, n, me] {
                           HostBuffer s(c, t), r(c, t);
                           fill(s.data(), c, t, [&](size_t i) { return payload(me, i, t); });
                           int next = (me + 1) % n, prev = (me + n - 1) % n;
                           auto rw = comm.recv(r.buf(), prev, 7);
                           auto sw = comm.send(s.buf(), next, 7);
                           sw->wait();
                           rw->wait();
                           return check(r.data(), c, t, 0, [&](size_t i) { return payload(prev, i, t); });
                         }});
      }
    }
    if (n > 1 && c <= 65536) {
      // Many transfers in flight at once on several tags: receives posted in
      // tag order, sends in reverse tag order; messages of one (peer, tag)
      // match in posting order.
      cases.push_back({"sendrecv_many_tags/f32/n=" + std::to_string(c), DT_CAP_SENDRECV, [&comm, c, n, me] {
                         const int kTags = 4, kPerTag = 4;
                         const DType t = DType::F32;
                         int next = (me + 1) % n, prev = (me + n - 1) % n;
                         std::vector<HostBuffer> sends, recvs;
                         for (int k = 0; k < kTags * kPerTag; ++k) {
                           sends.emplace_back(c, t);
                           recvs.emplace_back(c, t);
                           fill(sends.back().data(), c, t, [&](size_t i) { return payload(me, i + 31 * k, t); });
                         }
                         std::vector<std::shared_ptr<Work>> works;
                         for (int tag = 0; tag < kTags; ++tag)
                           for (int j = 0; j < kPerTag; ++j)
                             works.push_back(comm.recv(recvs[tag * kPerTag + j].buf(), prev, 100 + tag));
                         for (int tag = kTags - 1; tag >= 0; --tag)
                           for (int j = 0; j < kPerTag; ++j)
                             works.push_back(comm.send(sends[tag * kPerTag + j].buf(), next, 100 + tag));
                         for (auto& w : works) w->wait();
                         for (int k = 0; k < kTags * kPerTag; ++k) {
                           std::string e =
                               check(recvs[k].data(), c, t, 0, [&](size_t i) { return payload(prev, i + 31 * k, t); });
                           if (!e.empty()) return "message " + std::to_string(k) + ": " + e;
                         }
                         return std::string();
                       }});
    }
    cases.push_back({"barrier/n=" + std::to_string(c), DT_CAP_BARRIER, [&comm] {
                       comm.barrier()->wait();
                       return std::string();
                     }});
  }
  return cases;
}

// v rounded to what dtype t holds (written, then read back).
double in_dtype(double v, DType t) {
  uint8_t slot[8];
  write(slot, 0, t, v);
  return read(slot, 0, t);
}

}  // namespace

std::string check_reduction_values(int n) {
  for (DType t : kTypes)
    for (ReduceOp op : kOps)
      for (size_t i = 0; i < kPeriod; ++i) {
        const std::string where = std::string(dtype_name(t)) + "/" + to_string(op) + " at world size " +
                                  std::to_string(n) + ", index " + std::to_string(i);
        std::vector<double> v(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) {
          v[r] = contribution(n, r, i, t, op);
          if (in_dtype(v[r], t) != v[r]) return where + ": rank " + std::to_string(r) + "'s value is not exact";
        }
        // Avg reduces as a sum, then divides.
        auto combine = [&](double a, double b) -> std::optional<double> {
          const double exact = op == ReduceOp::Prod  ? a * b
                               : op == ReduceOp::Max ? std::max(a, b)
                               : op == ReduceOp::Min ? std::min(a, b)
                                                     : a + b;
          if (in_dtype(exact, t) != exact) return std::nullopt;
          return exact;
        };
        auto fail = [&](const char* order) { return where + ": a partial result in " + order + " is not exact"; };
        // The partial results of three orders a plugin may reduce in: rank order, reverse, pairwise (a tree).
        std::optional<double> fwd = v[0], back = v[n - 1];
        for (int r = 1; r < n && fwd && back; ++r) {
          fwd = combine(*fwd, v[r]);
          back = combine(*back, v[n - 1 - r]);
        }
        if (!fwd) return fail("rank order");
        if (!back) return fail("reverse rank order");
        std::vector<double> level = v;
        while (level.size() > 1) {
          std::vector<double> next;
          for (size_t k = 0; k + 1 < level.size(); k += 2) {
            auto c = combine(level[k], level[k + 1]);
            if (!c) return fail("a tree");
            next.push_back(*c);
          }
          if (level.size() % 2) next.push_back(level.back());
          level = std::move(next);
        }
        const double expected = reduce_expected(n, i, t, op);
        const double reduced = op == ReduceOp::Avg ? *fwd : expected;
        if (*fwd != reduced || *back != reduced || level[0] != reduced)
          return where + ": the orders disagree with the expected " + std::to_string(expected);
        if (tolerance(t, op) == 0 && in_dtype(expected, t) != expected)
          return where + ": the expected result " + std::to_string(expected) + " is not exact";
      }
  return "";
}

Result run(Communicator& comm, const Options& o) {
  Result res;
  struct DeviceScope {
    int prev;
    explicit DeviceScope(int d) : prev(tls_cuda_device()) { tls_cuda_device() = d; }
    ~DeviceScope() { tls_cuda_device() = prev; }
  } device_scope(o.cuda_device);
  uint64_t caps = comm.backend()->info().caps;
  for (auto& c : make_cases(comm, o)) {
    if (!o.filter.empty() && c.name.find(o.filter) == std::string::npos) continue;
    if (!(caps & c.cap)) {
      ++res.skipped;
      continue;
    }
    std::string err;
    try {
      err = c.body();
    } catch (const std::exception& e) {
      err = std::string("threw: ") + e.what();
    }
    if (err.empty()) {
      ++res.passed;
      if (o.verbose && comm.rank() == 0) std::printf("  ok   %s\n", c.name.c_str());
    } else {
      ++res.failed;
      res.failures.push_back("rank " + std::to_string(comm.rank()) + ": " + c.name + ": " + err);
      if (comm.is_poisoned()) break;  // nothing more can run on this communicator
    }
  }
  return res;
}

Result run_failures(Communicator& comm, const CommFactory& make_comm, const Options& o) {
  Result res;
  const int n = comm.size(), me = comm.rank();
  const uint64_t caps = comm.backend()->info().caps;
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  auto run_case = [&](const std::string& name, uint64_t cap, const std::function<std::string()>& body) {
    if (!o.filter.empty() && name.find(o.filter) == std::string::npos) return;
    if (n == 1 || !(caps & cap)) {
      ++res.skipped;
      return;
    }
    std::string err;
    try {
      err = body();
    } catch (const std::exception& e) {
      err = std::string("threw: ") + e.what();
    }
    if (err.empty()) {
      ++res.passed;
      if (o.verbose && me == 0) std::printf("  ok   %s\n", name.c_str());
    } else {
      ++res.failed;
      res.failures.push_back("rank " + std::to_string(me) + ": " + name + ": " + err);
    }
  };

  run_case("failure/timeout/allreduce_only_rank_0_joins", DT_CAP_ALLREDUCE, [&] {
    const auto timeout = std::chrono::milliseconds(500);
    auto fresh = make_comm("conformance-timeout", timeout);
    std::string err;
    if (me == 0) {
      std::vector<float> x(16, 1.0f);
      auto t0 = Clock::now();
      try {
        fresh->allreduce(Buffer(x.data(), x.size(), DType::F32), ReduceOp::Sum)->wait();
        err = "an all-reduce the other ranks never joined completed";
      } catch (const TimeoutError&) {
        double s = seconds_since(t0);
        if (s < 0.4 || s > 10)
          err = "timed out after " + std::to_string(s) + " s; the timeout is 0.5 s";
        else if (!fresh->is_poisoned())
          err = "the timed-out communicator is not poisoned";
      } catch (const std::exception& e) {
        err = std::string("failed with '") + e.what() + "' instead of a timeout";
      }
    }
    comm.barrier()->wait();  // the others keep their communicator until rank 0 is done
    return err;
  });

  run_case("failure/abort/recv_nobody_sends", DT_CAP_SENDRECV, [&] {
    auto fresh = make_comm("conformance-abort", std::chrono::milliseconds(60000));
    std::string err;
    if (me == 0) {
      float x[4] = {};
      auto w = fresh->recv(Buffer(x, 4, DType::F32), 1, 4242);
      std::thread aborter([w] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        w->abort();
      });
      auto t0 = Clock::now();
      try {
        w->wait();
        err = "a recv nobody sent completed";
      } catch (const AbortedError&) {
        double s = seconds_since(t0);
        if (s > 10) err = "the abort reached the waiter only after " + std::to_string(s) + " s";
      } catch (const std::exception& e) {
        err = std::string("failed with '") + e.what() + "' instead of an abort";
      }
      aborter.join();
      if (err.empty() && !fresh->is_poisoned()) err = "the aborted communicator is not poisoned";
    }
    comm.barrier()->wait();
    return err;
  });
  return res;
}

}  // namespace dtrain::conformance
