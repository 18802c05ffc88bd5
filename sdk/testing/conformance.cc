#include "conformance.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/sdk/support.h"

namespace dtrain::conformance {

namespace {

const DType kTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16,
                        DType::I8,  DType::U8,  DType::I32, DType::I64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod};

bool is_signed(DType t) { return t != DType::U8; }

// The value rank r contributes at global index i: small integers, exact in
// every dtype, whose sums over 4 ranks fit in int8 and whose products fit in f16.
double value(int r, size_t i, DType t, ReduceOp op) {
  if (op == ReduceOp::Prod) return 1.0 + static_cast<double>((i + r) % 2);
  double v = static_cast<double>((i * 7 + static_cast<size_t>(r) * 13) % 23);
  return is_signed(t) ? v - 11.0 : v;
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
  double acc = value(0, i, t, op);
  for (int r = 1; r < n; ++r) {
    double v = value(r, i, t, op);
    switch (op) {
      case ReduceOp::Sum: case ReduceOp::Avg: acc += v; break;
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

struct HostBuffer {
  std::vector<uint8_t> bytes;
  DType t;
  size_t n;
  HostBuffer(size_t count, DType type) : bytes(std::max<size_t>(count * dtype_size(type), 1), 0xA5), t(type), n(count) {}
  void* data() { return bytes.data(); }
  Buffer buf() { return Buffer(n ? data() : nullptr, n, t); }
};

// Compares got[i] with expect(i) for i in [0, n); returns "" or the first mismatch.
std::string check(const void* got, size_t n, DType t, double tol, const std::function<double(size_t)>& expect) {
  for (size_t i = 0; i < n; ++i) {
    double e = expect(i), g = read(got, i, t);
    bool ok = tol == 0 ? g == e : std::fabs(g - e) <= tol * std::max(1.0, std::fabs(e));
    if (!ok) {
      std::ostringstream os;
      os << "element " << i << " is " << g << ", expected " << e;
      return os.str();
    }
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
                           for (size_t i = 0; i < c; ++i) write(b.data(), i, t, value(me, i, t, op));
                           comm.allreduce(b.buf(), op)->wait();
                           return check(b.data(), c, t, tolerance(t, op),
                                        [&](size_t i) { return reduce_expected(n, i, t, op); });
                         }});
        int root = iteration++ % n;
        cases.push_back({"reduce" + suffix + on + nc + "/root=" + std::to_string(root), DT_CAP_REDUCE,
                         [&comm, c, t, op, n, me, root] {
                           HostBuffer s(c, t), r(me == root ? c : 0, t);
                           for (size_t i = 0; i < c; ++i) write(s.data(), i, t, value(me, i, t, op));
                           comm.reduce(s.buf(), r.buf(), op, root)->wait();
                           if (me != root) return std::string();
                           return check(r.data(), c, t, tolerance(t, op),
                                        [&](size_t i) { return reduce_expected(n, i, t, op); });
                         }});
        cases.push_back({"reduce_scatter" + suffix + on + nc, DT_CAP_REDUCE_SCATTER, [&comm, c, t, op, n, me] {
                           HostBuffer s(c * n, t), r(c, t);
                           for (size_t i = 0; i < c * n; ++i) write(s.data(), i, t, value(me, i, t, op));
                           comm.reduce_scatter(s.buf(), r.buf(), op)->wait();
                           return check(r.data(), c, t, tolerance(t, op), [&](size_t i) {
                             return reduce_expected(n, me * c + i, t, op);
                           });
                         }});
      }
      cases.push_back({"allreduce_out_of_place" + suffix + nc, DT_CAP_ALLREDUCE, [&comm, c, t, n, me] {
                         HostBuffer s(c, t), r(c, t);
                         for (size_t i = 0; i < c; ++i) write(s.data(), i, t, value(me, i, t, ReduceOp::Sum));
                         comm.allreduce(s.buf(), r.buf(), ReduceOp::Sum)->wait();
                         std::string e = check(r.data(), c, t, 0, [&](size_t i) {
                           return reduce_expected(n, i, t, ReduceOp::Sum);
                         });
                         if (!e.empty()) return e;
                         return check(s.data(), c, t, 0, [&](size_t i) { return value(me, i, t, ReduceOp::Sum); })
                                        .empty()
                                    ? std::string()
                                    : std::string("the send buffer was modified");
                       }});
      int root = iteration++ % n;
      cases.push_back({"broadcast" + suffix + nc + "/root=" + std::to_string(root), DT_CAP_BROADCAST,
                       [&comm, c, t, me, root] {
                         HostBuffer b(c, t);
                         if (me == root)
                           for (size_t i = 0; i < c; ++i) write(b.data(), i, t, value(root, i, t, ReduceOp::Sum));
                         comm.broadcast(b.buf(), root)->wait();
                         return check(b.data(), c, t, 0, [&](size_t i) { return value(root, i, t, ReduceOp::Sum); });
                       }});
      cases.push_back({"allgather" + suffix + nc, DT_CAP_ALLGATHER, [&comm, c, t, n, me] {
                         HostBuffer s(c, t), r(c * n, t);
                         for (size_t i = 0; i < c; ++i) write(s.data(), i, t, value(me, i, t, ReduceOp::Sum));
                         comm.allgather(s.buf(), r.buf())->wait();
                         return check(r.data(), c * n, t, 0,
                                      [&](size_t i) { return value(static_cast<int>(i / c), i % c, t, ReduceOp::Sum); });
                       }});
      cases.push_back({"alltoall" + suffix + nc, DT_CAP_ALLTOALL, [&comm, c, t, n, me] {
                         HostBuffer s(c * n, t), r(c * n, t);
                         for (size_t i = 0; i < c * n; ++i) write(s.data(), i, t, value(me, i, t, ReduceOp::Sum));
                         comm.alltoall(s.buf(), r.buf())->wait();
                         // Block j of rank i's send is block i of rank j's recv.
                         return check(r.data(), c * n, t, 0, [&](size_t i) {
                           return value(static_cast<int>(i / c), me * c + i % c, t, ReduceOp::Sum);
                         });
                       }});
      if (n > 1) {
        cases.push_back({"sendrecv_ring" + suffix + nc, DT_CAP_SENDRECV, [&comm, c, t, n, me] {
                           HostBuffer s(c, t), r(c, t);
                           for (size_t i = 0; i < c; ++i) write(s.data(), i, t, value(me, i, t, ReduceOp::Sum));
                           int next = (me + 1) % n, prev = (me + n - 1) % n;
                           auto rw = comm.recv(r.buf(), prev, 7);
                           auto sw = comm.send(s.buf(), next, 7);
                           sw->wait();
                           rw->wait();
                           return check(r.data(), c, t, 0, [&](size_t i) { return value(prev, i, t, ReduceOp::Sum); });
                         }});
      }
    }
    cases.push_back({"barrier/n=" + std::to_string(c), DT_CAP_BARRIER, [&comm] {
                       comm.barrier()->wait();
                       return std::string();
                     }});
  }
  return cases;
}

}  // namespace

Result run(Communicator& comm, const Options& o) {
  Result res;
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

}  // namespace dtrain::conformance
