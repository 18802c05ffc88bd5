#include "ps_conformance.h"

#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "ps_conformance_internal.h"
#include "dtrain/abi/backend_v1.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/sdk/random.h"
#include "dtrain/store.h"

namespace dtrain::conformance {

namespace psc {

uint64_t mix(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  using sdk::splitmix64;
  return splitmix64(splitmix64(splitmix64(splitmix64(a) ^ b) ^ c) ^ d);
}

float small_grad(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return static_cast<float>(static_cast<int>(mix(a, b, c, d) % 65) - 32) / 128.0f;
}

float any_float(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return static_cast<float>(static_cast<double>(mix(a, b, c, d) >> 11) * 0x1.0p-52 - 1.0);
}

Rule::Rule(const ps::TableConfig& c)
    : opt(c.optimizer),
      lr(c.learning_rate),
      beta1(c.beta1),
      beta2(c.beta2),
      epsilon(c.epsilon),
      initial_g2sum(c.initial_g2sum) {}

RowState new_row(const Rule& r, const float* init, size_t dim, bool dense) {
  RowState s;
  s.w.assign(init, init + dim);
  if (r.opt == ps::Optimizer::Adam) s.m.assign(dim, 0.0f), s.v.assign(dim, 0.0f);
  if (r.opt == ps::Optimizer::Adagrad) {
    s.g2 = static_cast<float>(r.initial_g2sum);
    if (dense) s.g2v.assign(dim, static_cast<float>(r.initial_g2sum));
  }
  return s;
}

// The formulas of DT_PS_OPT_*, evaluated as C reads them, in f32.
void apply_rule(const Rule& r, RowState& s, const float* g, bool dense) {
  const size_t dim = s.w.size();
  const float lr = static_cast<float>(r.lr), eps = static_cast<float>(r.epsilon);
  switch (r.opt) {
    case ps::Optimizer::Sgd:
      for (size_t i = 0; i < dim; ++i) s.w[i] -= lr * g[i];
      return;
    case ps::Optimizer::Adagrad:
      if (dense) {
        for (size_t i = 0; i < dim; ++i) {
          s.g2v[i] += g[i] * g[i];
          s.w[i] -= lr * g[i] / (std::sqrt(s.g2v[i]) + eps);
        }
      } else {
        float sum = 0;
        for (size_t i = 0; i < dim; ++i) sum += g[i] * g[i];
        s.g2 += sum / static_cast<float>(dim);
        for (size_t i = 0; i < dim; ++i) s.w[i] -= lr * g[i] / (std::sqrt(s.g2) + eps);
      }
      return;
    case ps::Optimizer::Adam: {
      s.t += 1;
      const float b1 = static_cast<float>(r.beta1), b2 = static_cast<float>(r.beta2);
      const float bc1 = static_cast<float>(1.0 - std::pow(r.beta1, static_cast<double>(s.t)));
      const float bc2 = static_cast<float>(1.0 - std::pow(r.beta2, static_cast<double>(s.t)));
      for (size_t i = 0; i < dim; ++i) {
        s.m[i] = b1 * s.m[i] + (1.0f - b1) * g[i];
        s.v[i] = b2 * s.v[i] + (1.0f - b2) * g[i] * g[i];
        s.w[i] -= lr * (s.m[i] / bc1) / (std::sqrt(s.v[i] / bc2) + eps);
      }
      return;
    }
  }
}

ps::TableConfig table_config(const std::string& name, ps::TableKind kind, uint64_t dim, ps::Optimizer opt,
                             uint64_t seed) {
  ps::TableConfig c;
  c.name = name;
  c.kind = kind;
  c.dim = dim;
  c.optimizer = opt;
  c.learning_rate = 0.0625;
  c.beta1 = 0.875;
  c.beta2 = 0.9375;
  c.epsilon = opt == ps::Optimizer::Adam ? 0x1.0p-20 : 0x1.0p-10;
  c.initial_g2sum = 0.25;
  c.initializer = ps::Initializer::Uniform;
  c.init_a = -0.5;
  c.init_b = 0.5;
  c.seed = seed;
  return c;
}

std::string compare(const float* got, const float* want, size_t n, size_t dim, const uint64_t* keys,
                    const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    if (a == b) continue;
    char buf[256];
    if (keys)
      std::snprintf(buf, sizeof buf,
                    "%s: key %" PRIu64 " (position %zu) value %zu is %.9g (0x%08x), expected %.9g (0x%08x)",
                    what.c_str(), keys[i / dim], i / dim, i % dim, got[i], a, want[i], b);
    else
      std::snprintf(buf, sizeof buf, "%s: value %zu is %.9g (0x%08x), expected %.9g (0x%08x)", what.c_str(), i, got[i],
                    a, want[i], b);
    return buf;
  }
  return "";
}

void Ctx::barrier() { worker->barrier()->wait(); }

void Ctx::in_turn(const std::function<void()>& fn) {
  for (int turn = 0; turn < W; ++turn) {
    barrier();
    if (turn == w) fn();
  }
  barrier();
}

std::vector<std::string> run_job(const std::shared_ptr<Backend>& backend, const PsOptions& o, const Job& job,
                                 const std::vector<Case>& cases) {
  const int S = job.servers, W = job.workers;
  auto store = std::make_shared<MemoryStore>();
  CommOptions base;
  base.store = store;
  base.config_toml = o.config_toml;
  base.timeout = o.timeout;
  base.name = job.name;
  base.job_id = "ps-conformance";
  base.num_servers = S;
  base.num_workers = W;
  base.world_size = W;
  base.local_world_size = S + W;
  base.job_token = "ps-conformance-token";

  std::mutex mu;
  std::vector<std::unique_ptr<ps::PsServer>> servers(S);
  std::vector<std::string> server_errors(S);
  std::atomic<int> served{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < S; ++s) {
    threads.emplace_back([&, s] {
      try {
        CommOptions so = base;
        so.role = Role::Server;
        so.rank = so.local_rank = s;
        auto srv = ps::start_server(backend, so);
        ps::PsServer* p = srv.get();
        {
          std::lock_guard<std::mutex> l(mu);
          servers[s] = std::move(srv);
        }
        p->serve();
      } catch (const std::exception& e) {
        server_errors[s] = std::string("server ") + std::to_string(s) + ": " + e.what();
      }
      served++;
    });
  }

  // errors[case][worker]
  std::vector<std::vector<std::string>> errors(cases.size(), std::vector<std::string>(W));
  std::vector<std::string> setup_errors(W);
  std::vector<std::thread> workers;
  for (int w = 0; w < W; ++w) {
    workers.emplace_back([&, w] {
      std::unique_ptr<ps::PsWorker> pw;
      try {
        CommOptions wo = base;
        wo.role = Role::Worker;
        wo.rank = wo.local_rank = w;
        pw = ps::connect_worker(backend, wo, job.mode);
      } catch (const std::exception& e) {
        setup_errors[w] = std::string("connect_worker failed: ") + e.what();
        return;
      }
      Ctx ctx;
      ctx.w = w, ctx.W = W, ctx.S = S, ctx.worker = pw.get(), ctx.options = &o;
      bool broken = false;
      for (size_t i = 0; i < cases.size(); ++i) {
        if (broken) {
          errors[i][w] = "not run: an earlier case threw on this worker";
          continue;
        }
        try {
          errors[i][w] = cases[i].body(ctx);
        } catch (const std::exception& e) {
          errors[i][w] = std::string("threw: ") + e.what();
          broken = true;
          continue;
        }
        try {
          ctx.barrier();
        } catch (const std::exception& e) {
          errors[i][w] = std::string("the barrier after the case threw: ") + e.what();
          broken = true;
        }
      }
      try {
        pw->finish();
      } catch (const std::exception& e) {
        setup_errors[w] = std::string("finish() threw: ") + e.what();
      }
      pw.reset();
    });
  }
  for (auto& t : workers) t.join();

  // Every worker finished: serve() must return on its own.
  std::string serve_error;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (served.load() < S && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (served.load() < S) {
    serve_error = "serve() did not return within 10 s after every worker called finish()";
    std::lock_guard<std::mutex> l(mu);
    for (auto& s : servers)
      if (s) s->stop("the conformance suite stops it");
  }
  for (auto& t : threads) t.join();
  servers.clear();

  std::string common;
  for (auto& e : server_errors)
    if (!e.empty()) common += (common.empty() ? "" : "; ") + e;
  for (int w = 0; w < W; ++w)
    if (!setup_errors[w].empty())
      common += (common.empty() ? "" : "; ") + ("worker " + std::to_string(w) + ": " + setup_errors[w]);
  if (!serve_error.empty()) common += (common.empty() ? "" : "; ") + serve_error;

  std::vector<std::string> out(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string e;
    for (int w = 0; w < W; ++w)
      if (!errors[i][w].empty()) e += (e.empty() ? "" : "; ") + ("worker " + std::to_string(w) + ": " + errors[i][w]);
    if (!common.empty()) e += (e.empty() ? "" : "; ") + ("job: " + common);
    out[i] = e;
  }
  return out;
}

void Recorder::record(const std::string& name, const std::string& err) {
  if (err.empty()) {
    ++res.passed;
    if (o.verbose) std::printf("  ok   %s\n", name.c_str());
  } else {
    ++res.failed;
    res.failures.push_back(name + ": " + err);
    if (o.verbose) std::printf("  FAIL %s: %s\n", name.c_str(), err.c_str());
  }
  std::fflush(stdout);
}

}  // namespace psc

Result run_ps(const std::shared_ptr<Backend>& backend, const PsOptions& o) {
  const uint64_t need = DT_CAP_PS_DENSE | DT_CAP_PS_SPARSE | DT_CAP_PS_SERVER;
  if (!backend->supports(need))
    throw NotSupported("backend '" + backend->name() +
                       "' lacks the parameter-server capability bits (ps-dense ps-sparse ps-server)");
  Result res;
  psc::Recorder rec{o, res};
  const ps::Mode modes[] = {ps::Mode::Sync, ps::Mode::Async, ps::Mode::Geo};
  int n = 0;
  for (ps::Mode m : modes) {
    for (int S : o.servers) {
      for (int W : o.workers) {
        psc::Job job;
        job.servers = S, job.workers = W;
        job.mode.mode = m;
        job.mode.geo_k_steps = m == ps::Mode::Geo ? 2 : 0;
        job.name = "psconf-" + std::to_string(n++);
        std::vector<psc::Case> cases;
        for (auto& c : psc::mode_cases(job, o))
          if (rec.wanted(c.name)) cases.push_back(std::move(c));
        if (cases.empty()) continue;
        auto errs = psc::run_job(backend, o, job, cases);
        for (size_t i = 0; i < cases.size(); ++i) rec.record(cases[i].name, errs[i]);
      }
    }
  }
  psc::run_init_cases(backend, rec);
  psc::run_determinism_cases(backend, rec);
  psc::run_save_cases(backend, rec);
  return res;
}

}  // namespace dtrain::conformance
