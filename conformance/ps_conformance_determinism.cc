// The PS conformance suite's sync determinism cases (see ps_conformance.h):
// the same sync job run twice ends with the same tables, bit for bit.
#include <string>

#include "ps_conformance_internal.h"

namespace dtrain::conformance::psc {

namespace {

// Sync training with general f32 gradients (sums round): the tables' final
// values after `steps` steps, from worker 0. averaged: a 1-worker job pushing
// the f32 average of what `of_workers` workers would push.
struct DetRun {
  Floats sparse_adam, sparse_adagrad, dense_adam, dense_sgd;
};

Body det_body(DetRun& out, int of_workers) {
  return [&out, of_workers](Ctx& c) {
    const uint64_t seed = 71;
    const size_t sdim = 8, ddim = 37;
    auto sa = c.worker->sparse_table(table_config("sa", ps::TableKind::Sparse, sdim, ps::Optimizer::Adam, seed));
    auto sg = c.worker->sparse_table(table_config("sg", ps::TableKind::Sparse, sdim, ps::Optimizer::Adagrad, seed));
    auto da = c.worker->dense_table(table_config("da", ps::TableKind::Dense, ddim, ps::Optimizer::Adam, seed));
    auto ds = c.worker->dense_table(table_config("ds", ps::TableKind::Dense, ddim, ps::Optimizer::Sgd, seed));
    Keys pool = key_pool(seed, 32);
    for (int n = 0; n < 4; ++n) {
      // Every worker pushes every pool key once (no repeats): the average of
      // two workers is then one f32 division per value.
      std::vector<Push> sp;
      std::vector<Floats> dp;
      for (int u = 0; u < of_workers; ++u) {
        sp.push_back(sparse_push(seed, u, n, pool, sdim, true, false));
        sp.back().keys = pool;
        sp.back().grads.resize(pool.size() * sdim);
        for (size_t i = 0; i < sp.back().grads.size(); ++i) sp.back().grads[i] = any_float(seed, u, n, i);
        dp.push_back(dense_grad(seed, u, n, ddim, true));
      }
      Push mine = sp[c.w];
      Floats dmine = dp[c.w];
      if (c.W == 1 && of_workers > 1) {
        for (size_t i = 0; i < mine.grads.size(); ++i) {
          float s = 0;
          for (int u = 0; u < of_workers; ++u) s += sp[u].grads[i];
          mine.grads[i] = s / static_cast<float>(of_workers);
        }
        for (size_t i = 0; i < ddim; ++i) {
          float s = 0;
          for (int u = 0; u < of_workers; ++u) s += dp[u][i];
          dmine[i] = s / static_cast<float>(of_workers);
        }
      }
      push(sa, mine);
      push(sg, mine);
      da.push(fbuf(dmine))->wait();
      ds.push(fbuf(dmine))->wait();
    }
    DetRun r{pull(sa, pool), pull(sg, pool), pull(da), pull(ds)};
    if (c.w == 0) out = r;
    return std::string();
  };
}

std::string compare_runs(const DetRun& a, const DetRun& b, const std::string& what) {
  if (a.dense_sgd.empty() || b.dense_sgd.empty()) return "a run produced no values (it failed)";
  FirstError err;
  err(compare(a.sparse_adam.data(), b.sparse_adam.data(), a.sparse_adam.size(), 8, nullptr, what + ", sparse adam"));
  err(compare(a.sparse_adagrad.data(), b.sparse_adagrad.data(), a.sparse_adagrad.size(), 8, nullptr,
              what + ", sparse adagrad"));
  err(compare(a.dense_adam.data(), b.dense_adam.data(), a.dense_adam.size(), 37, nullptr, what + ", dense adam"));
  err(compare(a.dense_sgd.data(), b.dense_sgd.data(), a.dense_sgd.size(), 37, nullptr, what + ", dense sgd"));
  return err.e;
}

std::string run_det(const std::shared_ptr<Backend>& b, const Recorder& rec, int S, int W, int of_workers,
                    const std::string& name, DetRun& out) {
  Job job;
  job.servers = S, job.workers = W, job.mode.mode = ps::Mode::Sync, job.name = name;
  auto errs = run_job(b, rec.o, job, {{name, det_body(out, of_workers)}});
  return errs[0].empty() ? "" : name + ": " + errs[0];
}

}  // namespace

void run_determinism_cases(const std::shared_ptr<Backend>& b, Recorder& rec) {
  // Two runs (workers, workers averaged over, tag), the second compared with the first.
  struct Run {
    int workers, of_workers;
    const char* tag;
  };
  struct Pair {
    const char* name;
    Run first, second;
    const char* what;
  };
  for (const Pair& p : {Pair{"determinism/sync/two_runs_bit_identical/S2xW3",
                             {3, 3, "psconf-det-a"},
                             {3, 3, "psconf-det-b"},
                             "second run vs first"},
                        Pair{"determinism/sync/2_workers_equal_1_worker_pushing_the_average/S2",
                             {1, 2, "psconf-det-w1"},
                             {2, 2, "psconf-det-w2"},
                             "2 workers vs 1 worker pushing their average"}}) {
    if (!rec.wanted(p.name)) continue;
    DetRun first, second;
    std::string e = run_det(b, rec, 2, p.first.workers, p.first.of_workers, p.first.tag, first);
    if (e.empty()) e = run_det(b, rec, 2, p.second.workers, p.second.of_workers, p.second.tag, second);
    if (e.empty()) e = compare_runs(second, first, p.what);
    rec.record(p.name, e);
  }
}

}  // namespace dtrain::conformance::psc
