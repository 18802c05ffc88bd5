// The cases of the PS conformance suite (see ps_conformance.h).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <unistd.h>

#include "ps_conformance_internal.h"
#include "dtrain/buffer.h"
#include "dtrain/error.h"

namespace dtrain::conformance::psc {

Keys key_pool(uint64_t seed, size_t n) {
  Keys k = {0, 1, UINT64_MAX, 1ull << 63};
  for (size_t i = k.size(); i < n; ++i) k.push_back(mix(seed, i, 12345));
  return k;
}
Keys with_repeats(const Keys& pool) {
  Keys k = pool;
  k.insert(k.end(), pool.begin(), pool.begin() + 3);
  return k;
}

Push sparse_push(uint64_t seed, int u, int n, const Keys& pool, size_t dim, bool general, bool repeats) {
  Push p;
  for (auto k : pool)
    if (mix(seed, u, n, k) % 4 != 0) p.keys.push_back(k);
  if (p.keys.empty()) p.keys.push_back(pool[u % pool.size()]);
  size_t base = p.keys.size();
  if (repeats)
    for (size_t i = 0; i < std::min<size_t>(2, base); ++i) p.keys.push_back(p.keys[i]);
  p.grads.resize(p.keys.size() * dim);
  for (size_t j = 0; j < p.keys.size(); ++j)
    for (size_t i = 0; i < dim; ++i)
      p.grads[j * dim + i] = general ? any_float(seed, u * 1000 + n, j, i) : small_grad(seed, u * 1000 + n, j, i);
  return p;
}

Floats dense_grad(uint64_t seed, int u, int n, size_t dim, bool general) {
  Floats g(dim);
  for (size_t i = 0; i < dim; ++i) g[i] = general ? any_float(seed, u, n, i) : small_grad(seed, u, n, i);
  return g;
}

void push(ps::SparseTable& t, const Push& p) { t.push(p.keys.data(), p.keys.size(), fbuf(p.grads))->wait(); }

namespace {

constexpr int kSteps = 3;

std::string opt_name(ps::Optimizer o) { return ps::to_string(o); }
std::string job_tag(const Job& j) { return "S" + std::to_string(j.servers) + "xW" + std::to_string(j.workers); }

// The reference of a sparse table, row by key.
struct SparseRef {
  Rule rule;
  size_t dim;
  std::map<uint64_t, RowState> rows;
  SparseRef(const ps::TableConfig& c) : rule(c), dim(c.dim) {}
  void init(const Keys& keys, const Floats& values) {
    for (size_t j = 0; j < keys.size(); ++j)
      if (!rows.count(keys[j])) rows[keys[j]] = new_row(rule, &values[j * dim], dim, false);
  }
  // Per key: the rows of pushes in order (workers in order), summed.
  std::map<uint64_t, Floats> sum(const std::vector<const Push*>& pushes) const {
    std::map<uint64_t, Floats> acc;
    for (auto* p : pushes)
      for (size_t j = 0; j < p->keys.size(); ++j) {
        auto& a = acc[p->keys[j]];
        if (a.empty()) a.assign(dim, 0.0f);
        for (size_t i = 0; i < dim; ++i) a[i] += p->grads[j * dim + i];
      }
    return acc;
  }
  void apply(const std::map<uint64_t, Floats>& acc, int divide_by) {
    for (auto& [k, g] : acc) {
      Floats avg(g);
      if (divide_by != 1)
        for (auto& x : avg) x /= static_cast<float>(divide_by);
      apply_rule(rule, rows.at(k), avg.data(), false);
    }
  }
  void apply_push(const Push& p) { apply(sum({&p}), 1); }    // async: one push alone
  void apply_step(const std::vector<Push>& pushes, int W) {  // sync: step of every worker
    std::vector<const Push*> ps;
    for (auto& p : pushes) ps.push_back(&p);
    apply(sum(ps), W);
  }
  Floats values(const Keys& keys) const {
    Floats v;
    for (auto k : keys) v.insert(v.end(), rows.at(k).w.begin(), rows.at(k).w.end());
    return v;
  }
};

Body sparse_case(ps::Optimizer opt, size_t dim, uint64_t seed, ps::Mode mode) {
  return [=](Ctx& c) {
    FirstError err;
    auto cfg = table_config("sparse_" + opt_name(opt), ps::TableKind::Sparse, dim, opt, seed);
    auto t = c.worker->sparse_table(cfg);
    Keys pool = key_pool(seed, 24), pl = with_repeats(pool);
    Floats init = pull(t, pl);
    err(compare(&init[pool.size() * dim], init.data(), 3 * dim, dim, &pl[pool.size()], "a key repeated in one pull"));
    SparseRef ref(cfg);
    ref.init(pool, init);
    c.barrier();  // every worker has its initial rows before anyone pushes
    for (int n = 0; n < kSteps; ++n) {
      std::vector<Push> pushes;
      for (int u = 0; u < c.W; ++u) pushes.push_back(sparse_push(seed, u, n, pool, dim));
      if (mode == ps::Mode::Sync) {
        push(t, pushes[c.w]);
        ref.apply_step(pushes, c.W);
      } else {
        c.in_turn([&] { push(t, pushes[c.w]); });
        for (auto& p : pushes) ref.apply_push(p);
      }
      Floats got = pull(t, pl);
      err(compare(got.data(), ref.values(pl).data(), got.size(), dim, pl.data(),
                  "pull after step " + std::to_string(n)));
      if (mode != ps::Mode::Sync) c.barrier();  // nobody pushes the next step before every pull
    }
    return err.e;
  };
}

Body dense_case(ps::Optimizer opt, size_t dim, uint64_t seed, ps::Mode mode) {
  return [=](Ctx& c) {
    FirstError err;
    auto cfg = table_config("dense_" + opt_name(opt) + "_" + std::to_string(dim), ps::TableKind::Dense, dim, opt, seed);
    auto t = c.worker->dense_table(cfg);
    Floats init = pull(t);
    Rule rule(cfg);
    RowState ref = new_row(rule, init.data(), dim, true);
    c.barrier();
    for (int n = 0; n < kSteps; ++n) {
      std::vector<Floats> g;
      for (int u = 0; u < c.W; ++u) g.push_back(dense_grad(seed, u, n, dim));
      if (mode == ps::Mode::Sync) {
        t.push(fbuf(g[c.w]))->wait();
        Floats sum(dim, 0.0f);
        for (int u = 0; u < c.W; ++u)
          for (size_t i = 0; i < dim; ++i) sum[i] += g[u][i];
        for (auto& x : sum) x /= static_cast<float>(c.W);
        apply_rule(rule, ref, sum.data(), true);
      } else {
        c.in_turn([&] { t.push(fbuf(g[c.w]))->wait(); });
        for (auto& gu : g) apply_rule(rule, ref, gu.data(), true);
      }
      Floats got = pull(t);
      err(compare(got.data(), ref.w.data(), dim, dim, nullptr, "pull after step " + std::to_string(n)));
      if (mode != ps::Mode::Sync) c.barrier();
    }
    return err.e;
  };
}

// Async, every worker pushing at once, no barriers: SGD on values whose sums
// are exact, so every arrival order gives the reference.
Body async_concurrent_case(uint64_t seed) {
  return [=](Ctx& c) {
    FirstError err;
    const size_t sdim = 5, ddim = 37;
    auto scfg = table_config("concurrent_sparse", ps::TableKind::Sparse, sdim, ps::Optimizer::Sgd, seed);
    auto dcfg = table_config("concurrent_dense", ps::TableKind::Dense, ddim, ps::Optimizer::Sgd, seed);
    for (auto* cfg : {&scfg, &dcfg}) cfg->initializer = ps::Initializer::Constant, cfg->init_a = 0.5;
    auto st = c.worker->sparse_table(scfg);
    auto dt = c.worker->dense_table(dcfg);
    Keys pool = key_pool(seed, 20);
    const int rounds = 4;
    for (int n = 0; n < rounds; ++n) {
      push(st, sparse_push(seed, c.w, n, pool, sdim));
      dt.push(fbuf(dense_grad(seed, c.w, n, ddim)))->wait();
    }
    c.barrier();
    Floats half(sdim, 0.5f), dhalf(ddim, 0.5f);
    SparseRef sref(scfg);
    for (auto k : pool) sref.rows[k] = new_row(sref.rule, half.data(), sdim, false);
    Rule drule(dcfg);
    RowState dref = new_row(drule, dhalf.data(), ddim, true);
    for (int u = 0; u < c.W; ++u)
      for (int n = 0; n < rounds; ++n) {
        sref.apply_push(sparse_push(seed, u, n, pool, sdim));
        Floats g = dense_grad(seed, u, n, ddim);
        apply_rule(drule, dref, g.data(), true);
      }
    Floats got = pull(st, pool);
    err(compare(got.data(), sref.values(pool).data(), got.size(), sdim, pool.data(), "sparse, after every push"));
    Floats dgot = pull(dt);
    err(compare(dgot.data(), dref.w.data(), ddim, ddim, nullptr, "dense, after every push"));
    return err.e;
  };
}

// Sync, large: a dense table and a sparse pull/push of o.large_count floats.
Body sync_large_case(uint64_t seed) {
  return [=](Ctx& c) {
    FirstError err;
    const size_t count = c.options->large_count, dim = 8, nkeys = count / dim;
    auto dcfg = table_config("large_dense", ps::TableKind::Dense, count, ps::Optimizer::Sgd, seed);
    auto scfg = table_config("large_sparse", ps::TableKind::Sparse, dim, ps::Optimizer::Sgd, seed);
    auto dt = c.worker->dense_table(dcfg);
    auto st = c.worker->sparse_table(scfg);
    Keys keys(nkeys);
    for (size_t i = 0; i < nkeys; ++i) keys[i] = mix(seed, i, 777);
    Floats d0 = pull(dt), s0 = pull(st, keys);
    c.barrier();
    auto grad = [&](int u, size_t i) { return small_grad(seed, u, i % 4099, i / 4099); };
    Floats dg(count), sg(nkeys * dim);
    for (size_t i = 0; i < count; ++i) dg[i] = grad(c.w, i);
    for (size_t i = 0; i < sg.size(); ++i) sg[i] = grad(c.w + 100, i);
    dt.push(fbuf(dg))->wait();
    st.push(keys.data(), nkeys, fbuf(sg))->wait();
    const float lr = static_cast<float>(dcfg.learning_rate), W = static_cast<float>(c.W);
    auto expect = [&](Floats v, int off) {
      for (size_t i = 0; i < v.size(); ++i) {
        float s = 0;
        for (int u = 0; u < c.W; ++u) s += grad(u + off, i);
        v[i] -= lr * (s / W);
      }
      return v;
    };
    Floats d1 = pull(dt), s1 = pull(st, keys);
    err(compare(d1.data(), expect(d0, 0).data(), count, count, nullptr, "dense after one step"));
    err(compare(s1.data(), expect(s0, 100).data(), s1.size(), dim, keys.data(), "sparse after one step"));
    return err.e;
  };
}

// GEO: the worker-side algorithm of ps.h simulated for every worker; the
// workers' k-step syncs run in worker order.
struct GeoSim {
  int W;
  size_t dim;
  std::map<uint64_t, Floats> server;
  std::vector<std::map<uint64_t, Floats>> latest, old;
  GeoSim(int w, size_t d) : W(w), dim(d), latest(w), old(w) {}
  void touch(int u, uint64_t k) {
    if (!latest[u].count(k)) latest[u][k] = old[u][k] = server.at(k);
  }
  void sync(int u) {
    for (auto& [k, L] : latest[u]) {
      Floats& O = old[u][k];
      Floats& S = server[k];
      for (size_t i = 0; i < dim; ++i) {
        float delta = (L[i] - O[i]) / static_cast<float>(W);
        O[i] += delta;
        S[i] += delta;
      }
    }
    for (auto& [k, L] : latest[u]) {
      Floats& O = old[u][k];
      const Floats& S = server[k];
      for (size_t i = 0; i < dim; ++i) {
        L[i] += S[i] - O[i];
        O[i] = S[i];
      }
    }
  }
};

Body geo_sparse_case(uint64_t seed, int k) {
  return [=](Ctx& c) {
    FirstError err;
    const size_t dim = 5;
    auto cfg = table_config("geo_sparse", ps::TableKind::Sparse, dim, ps::Optimizer::Sgd, seed);
    const float lr = static_cast<float>(cfg.learning_rate);
    auto t = c.worker->sparse_table(cfg);
    Keys pool = key_pool(seed, 16);
    Floats init = pull(t, pool);
    c.barrier();
    GeoSim sim(c.W, dim);
    for (size_t j = 0; j < pool.size(); ++j) sim.server[pool[j]] = Floats(&init[j * dim], &init[(j + 1) * dim]);
    auto keys_of = [&](int u) {
      Keys ks;
      for (auto key : pool)
        if (mix(seed, u, key) % 3 != 0) ks.push_back(key);
      if (ks.empty()) ks.push_back(pool[u]);
      return ks;
    };
    ps::GeoSparseTable geo(t, c.W, k);
    const Keys mine = keys_of(c.w);
    const int rounds = 2;
    for (int r = 0; r < rounds; ++r) {
      for (int s = 0; s < k; ++s) {
        Floats got(mine.size() * dim);
        geo.lookup(mine.data(), mine.size(), got.data());
        for (int u = 0; u < c.W; ++u)
          for (auto key : keys_of(u)) sim.touch(u, key);
        Floats want;
        for (auto key : mine) want.insert(want.end(), sim.latest[c.w][key].begin(), sim.latest[c.w][key].end());
        std::string at = "round " + std::to_string(r) + " step " + std::to_string(s);
        err(compare(got.data(), want.data(), got.size(), dim, mine.data(), "local rows at " + at));
        std::vector<Floats> g(c.W);
        for (int u = 0; u < c.W; ++u) {
          Keys ku = keys_of(u);
          for (size_t j = 0; j < ku.size(); ++j)
            for (size_t i = 0; i < dim; ++i) {
              float x = small_grad(seed, u * 100 + r * k + s, ku[j], i);
              g[u].push_back(x);
              sim.latest[u][ku[j]][i] -= lr * x;
            }
        }
        geo.apply(mine.data(), mine.size(), g[c.w].data());
        if (s < k - 1) {
          geo.step();
        } else {
          c.in_turn([&] { geo.step(); });
          for (int u = 0; u < c.W; ++u) sim.sync(u);
        }
      }
    }
    Floats got(mine.size() * dim), want;
    geo.lookup(mine.data(), mine.size(), got.data());
    for (auto key : mine) want.insert(want.end(), sim.latest[c.w][key].begin(), sim.latest[c.w][key].end());
    err(compare(got.data(), want.data(), got.size(), dim, mine.data(), "local rows at the end"));
    Floats srv = pull(t, pool), swant;
    for (auto key : pool) swant.insert(swant.end(), sim.server[key].begin(), sim.server[key].end());
    err(compare(srv.data(), swant.data(), srv.size(), dim, pool.data(), "server rows at the end"));
    return err.e;
  };
}

Body geo_dense_case(uint64_t seed, int k) {
  return [=](Ctx& c) {
    FirstError err;
    const size_t dim = 37;
    auto cfg = table_config("geo_dense", ps::TableKind::Dense, dim, ps::Optimizer::Sgd, seed);
    const float lr = static_cast<float>(cfg.learning_rate);
    auto t = c.worker->dense_table(cfg);
    Floats init = pull(t);
    c.barrier();
    GeoSim sim(c.W, dim);
    sim.server[0] = init;
    for (int u = 0; u < c.W; ++u) sim.touch(u, 0);
    ps::GeoDenseTable geo(t, c.W, k);
    err(compare(geo.values(), init.data(), dim, dim, nullptr, "the local copy at the start"));
    const int rounds = 2;
    for (int r = 0; r < rounds; ++r) {
      for (int s = 0; s < k; ++s) {
        float* v = geo.values();
        err(compare(v, sim.latest[c.w][0].data(), dim, dim, nullptr,
                    "local copy at round " + std::to_string(r) + " step " + std::to_string(s)));
        for (int u = 0; u < c.W; ++u) {
          Floats g = dense_grad(seed, u, r * k + s, dim);
          for (size_t i = 0; i < dim; ++i) {
            sim.latest[u][0][i] -= lr * g[i];
            if (u == c.w) v[i] -= lr * g[i];
          }
        }
        if (s < k - 1) {
          geo.step();
        } else {
          c.in_turn([&] { geo.step(); });
          for (int u = 0; u < c.W; ++u) sim.sync(u);
        }
      }
    }
    err(compare(geo.values(), sim.latest[c.w][0].data(), dim, dim, nullptr, "local copy at the end"));
    Floats srv = pull(t);
    err(compare(srv.data(), sim.server[0].data(), dim, dim, nullptr, "server values at the end"));
    return err.e;
  };
}

}  // namespace

std::vector<Case> mode_cases(const Job& job, const PsOptions& o) {
  (void)o;
  std::vector<Case> cases;
  const std::string m = ps::to_string(job.mode.mode), tag = m + "/" + job_tag(job);
  if (job.mode.mode == ps::Mode::Geo) {
    cases.push_back({tag + "/sparse", geo_sparse_case(31, job.mode.geo_k_steps)});
    cases.push_back({tag + "/dense", geo_dense_case(32, job.mode.geo_k_steps)});
    // GEO applies the rule on the workers: only SGD is accepted, and the
    // refusal fails that declaration only.
    cases.push_back(
        {tag + "/refuses_adam", [](Ctx& c) {
           std::string err;
           try {
             c.worker->sparse_table(table_config("geo_adam", ps::TableKind::Sparse, 4, ps::Optimizer::Adam, 33));
             err = "a GEO job accepted a sparse table with adam";
           } catch (const InvalidUsage&) {
           } catch (const std::exception& e) {
             err = std::string("refused with '") + e.what() + "', not InvalidUsage";
           }
           auto t = c.worker->sparse_table(table_config("geo_after", ps::TableKind::Sparse, 4, ps::Optimizer::Sgd, 34));
           Keys k = key_pool(34, 4);
           pull(t, k);
           return err;
         }});
    return cases;
  }
  uint64_t seed = 40;
  for (auto opt : {ps::Optimizer::Sgd, ps::Optimizer::Adagrad, ps::Optimizer::Adam}) {
    // adagrad's per-row mean over a power-of-two dim is exact; the others odd dims
    size_t sdim = opt == ps::Optimizer::Adagrad ? 8 : 5;
    cases.push_back({tag + "/sparse/" + opt_name(opt), sparse_case(opt, sdim, seed++, job.mode.mode)});
    cases.push_back({tag + "/dense/" + opt_name(opt), dense_case(opt, 37, seed++, job.mode.mode)});
  }
  if (job.mode.mode == ps::Mode::Async) cases.push_back({tag + "/sgd_concurrent_pushes", async_concurrent_case(50)});
  if (job.mode.mode == ps::Mode::Sync && job.servers == 2 && job.workers == 2)
    cases.push_back({tag + "/large", sync_large_case(60)});
  return cases;
}

// ---------------------------------------------------------------- initializers

void run_init_cases(const std::shared_ptr<Backend>& b, Recorder& rec) {
  const std::string indep = "init/server_count_independent";
  std::map<int, Floats> uni, nor;
  Keys unseen;
  for (int i = 0; i < 64; ++i) unseen.push_back(mix(99, i));
  unseen.push_back(unseen[5]);
  for (int S = 1; S <= 3; ++S) {
    std::string name = "init/S" + std::to_string(S) + "/unseen_keys";
    if (!rec.wanted(name) && !rec.wanted(indep)) continue;
    Job job;
    job.servers = S, job.workers = 1, job.mode.mode = ps::Mode::Async, job.name = "psconf-init-" + std::to_string(S);
    Body body = [&, S](Ctx& c) {
      FirstError err;
      const size_t dim = 8;
      auto ucfg = table_config("uniform", ps::TableKind::Sparse, dim, ps::Optimizer::Sgd, 7);
      auto ncfg = table_config("normal", ps::TableKind::Sparse, dim, ps::Optimizer::Sgd, 9);
      ncfg.initializer = ps::Initializer::Normal, ncfg.init_a = 0.25, ncfg.init_b = 0.5;
      auto ccfg = table_config("constant", ps::TableKind::Sparse, 5, ps::Optimizer::Sgd, 3);
      ccfg.initializer = ps::Initializer::Constant, ccfg.init_a = 0.375;
      auto dcfg = table_config("dense_constant", ps::TableKind::Dense, 37, ps::Optimizer::Sgd, 3);
      dcfg.initializer = ps::Initializer::Constant, dcfg.init_a = 0.375;
      auto ut = c.worker->sparse_table(ucfg), nt = c.worker->sparse_table(ncfg), ct = c.worker->sparse_table(ccfg);
      auto dt = c.worker->dense_table(dcfg);
      Floats d0 = pull(dt);
      for (float x : d0)
        if (x != 0.375f) err("dense constant initializer: a value is " + std::to_string(x) + ", expected 0.375");
      // Train other keys first: unseen keys still pull their initial rows.
      Keys trained = key_pool(5, 16);
      for (auto* t : {&ut, &nt}) push(*t, sparse_push(5, 0, 0, trained, dim));
      push(ct, sparse_push(5, 0, 0, trained, 5));
      Floats u = pull(ut, unseen), n = pull(nt, unseen), k = pull(ct, unseen);
      for (float x : k)
        if (x != 0.375f) err("constant initializer: a value is " + std::to_string(x) + ", expected 0.375");
      bool all_same = true;
      for (float x : u) {
        if (!(x >= -0.5f && x < 0.5f)) err("uniform initializer [-0.5, 0.5): a value is " + std::to_string(x));
        all_same = all_same && x == u[0];
      }
      if (all_same) err("uniform initializer: every value is " + std::to_string(u[0]));
      double mean = 0, var = 0;
      const size_t cnt = n.size() - dim;  // leave out the repeated key
      for (size_t i = 0; i < cnt; ++i) mean += n[i];
      mean /= double(cnt);
      for (size_t i = 0; i < cnt; ++i) var += (n[i] - mean) * (n[i] - mean);
      double sd = std::sqrt(var / double(cnt - 1));
      if (std::fabs(mean - 0.25) > 0.12 || sd < 0.35 || sd > 0.65)
        err("normal initializer (mean 0.25, sd 0.5): " + std::to_string(cnt) + " values have mean " +
            std::to_string(mean) + ", sd " + std::to_string(sd));
      const size_t last = unseen.size() - 1;
      err(compare(&u[last * dim], &u[5 * dim], dim, dim, &unseen[last], "a key repeated in one pull"));
      // The rows exist now and keep their values.
      Floats u2 = pull(ut, unseen);
      err(compare(u2.data(), u.data(), u.size(), dim, unseen.data(), "a second pull of the same keys"));
      uni[S] = u, nor[S] = n;
      (void)c;
      return err.e;
    };
    auto errs = run_job(b, rec.o, job, {{name, body}});
    if (rec.wanted(name)) rec.record(name, errs[0]);
  }
  if (!rec.wanted(indep)) return;
  std::string e;
  for (int S = 2; S <= 3 && e.empty(); ++S) {
    if (!uni.count(1) || !uni.count(S)) {
      e = "no rows from the jobs above (they failed)";
      break;
    }
    e = compare(uni[S].data(), uni[1].data(), uni[1].size(), 8, unseen.data(),
                "uniform rows on " + std::to_string(S) + " servers vs 1");
    if (e.empty())
      e = compare(nor[S].data(), nor[1].data(), nor[1].size(), 8, unseen.data(),
                  "normal rows on " + std::to_string(S) + " servers vs 1");
  }
  rec.record(indep, e);
}

}  // namespace dtrain::conformance::psc
