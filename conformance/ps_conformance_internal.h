#pragma once
// Internals of the PS conformance suite shared by its files: the reference
// rules (ps_conformance.cc), the in-process job that runs cases
// (ps_conformance.cc) and the cases (ps_conformance_cases.cc,
// ps_conformance_save.cc).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ps_conformance.h"
#include "dtrain/ps.h"

namespace dtrain::conformance::psc {

using Floats = std::vector<float>;
using Keys = std::vector<uint64_t>;

inline Buffer fbuf(const Floats& v) { return Buffer(const_cast<float*>(v.data()), v.size(), DType::F32); }

// A table's current values (unwritten slots would read -777).
inline Floats pull(ps::SparseTable& t, const Keys& keys) {
  Floats v(keys.size() * t.dim(), -777.0f);
  t.pull(keys.data(), keys.size(), fbuf(v))->wait();
  return v;
}
inline Floats pull(ps::DenseTable& t) {
  Floats v(t.dim(), -777.0f);
  t.pull(fbuf(v))->wait();
  return v;
}

// splitmix64 (dtrain/sdk/random.h) of a, then of that xor b, c and d in turn.
uint64_t mix(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0);
// A gradient with few significant bits: k / 128 for k in [-32, 32] (products
// and sums of a few of them are exact in f32).
float small_grad(uint64_t a, uint64_t b, uint64_t c, uint64_t d);
// A general f32 in [-1, 1), every mantissa bit in use (sums round).
float any_float(uint64_t a, uint64_t b, uint64_t c, uint64_t d);

// The optimizer rule of a table, exactly as DT_PS_OPT_* defines it, in f32.
struct Rule {
  ps::Optimizer opt = ps::Optimizer::Sgd;
  double lr = 0, beta1 = 0, beta2 = 0, epsilon = 0, initial_g2sum = 0;
  explicit Rule(const ps::TableConfig& c);
};

// One sparse row (dense: the whole table) with its optimizer state.
struct RowState {
  Floats w, m, v, g2v;  // g2v: dense adagrad, per value
  float g2 = 0;         // sparse adagrad, per row
  int64_t t = 0;        // adam steps of this row (dense: of the table)
};
RowState new_row(const Rule& r, const float* init, size_t dim, bool dense);
// One optimizer step with gradient g (dim floats).
void apply_rule(const Rule& r, RowState& s, const float* g, bool dense);

// A table config with the suite's exact hyper-parameters (see the header):
// lr 1/16, beta1 7/8, beta2 15/16, epsilon 2^-10 (adam 2^-20), initial g2sum
// 1/4, uniform initializer in [-0.5, 0.5).
ps::TableConfig table_config(const std::string& name, ps::TableKind kind, uint64_t dim, ps::Optimizer opt,
                             uint64_t seed = 7);

// got vs want, bit for bit; "" or the first difference, naming the row (key)
// and the index in it. keys may be null (dense).
std::string compare(const float* got, const float* want, size_t n, size_t dim, const uint64_t* keys,
                    const std::string& what);

// What a case's body gets on each worker thread.
struct Ctx {
  int w = 0, W = 1, S = 1;
  ps::PsWorker* worker = nullptr;
  const PsOptions* options = nullptr;
  void barrier();
  // Runs fn on this worker when it is worker `turn`'s turn, for every turn
  // in worker order, with barriers between: pushes serialized in worker order.
  void in_turn(const std::function<void()>& fn);
};
using Body = std::function<std::string(Ctx&)>;
struct Case {
  std::string name;
  Body body;
};

struct Job {
  int servers = 1, workers = 1;
  ps::ModeOptions mode;
  std::string name;  // the communicator name, unique per job
};

// Starts the job's servers and workers as threads and runs every case on
// every worker, in order, with a barrier between cases. Returns per case ""
// or the failures ("worker 1: ..."). A case that throws ends that worker's
// run (the others then fail at their next barrier, by timeout).
std::vector<std::string> run_job(const std::shared_ptr<Backend>& backend, const PsOptions& o, const Job& job,
                                 const std::vector<Case>& cases);

// Keeps the pass/fail counts and prints.
struct Recorder {
  const PsOptions& o;
  Result& res;
  // A filter starting with '^' matches the start of the name only.
  bool wanted(const std::string& name) const {
    if (!o.filter.empty() && o.filter[0] == '^') return name.compare(0, o.filter.size() - 1, o.filter, 1) == 0;
    return o.filter.empty() || name.find(o.filter) != std::string::npos;
  }
  void record(const std::string& name, const std::string& err);
};

// The suite's inputs (ps_conformance_cases.cc).
// 0, 1, the largest key and the top bit, then random keys.
Keys key_pool(uint64_t seed, size_t n);
// The pool and its first three keys again: repeated keys in one pull.
Keys with_repeats(const Keys& pool);
struct Push {
  Keys keys;
  Floats grads;
};
// Worker u's push of step n: a subset of the pool (never empty), its first
// two keys repeated at the end (their rows are summed by the server).
Push sparse_push(uint64_t seed, int u, int n, const Keys& pool, size_t dim, bool general = false, bool repeats = true);
Floats dense_grad(uint64_t seed, int u, int n, size_t dim, bool general = false);
void push(ps::SparseTable& t, const Push& p);

// Keeps the first failure of a case (a case never returns early: the workers
// must stay in step through its barriers).
struct FirstError {
  std::string e;
  void operator()(const std::string& x) {
    if (e.empty() && !x.empty()) e = x;
  }
};

// The cases (ps_conformance_cases.cc, ps_conformance_determinism.cc).
std::vector<Case> mode_cases(const Job& job, const PsOptions& o);  // the kind x rule matrix of one mode
void run_init_cases(const std::shared_ptr<Backend>& b, Recorder& rec);
void run_determinism_cases(const std::shared_ptr<Backend>& b, Recorder& rec);
void run_save_cases(const std::shared_ptr<Backend>& b, Recorder& rec);

}  // namespace dtrain::conformance::psc
