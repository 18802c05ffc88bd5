// `dtrain-bench ps`: the child processes (a dtrain PS server, a worker) and
// the dtrain side of the comparison.
#include <algorithm>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "ps_internal.h"
#include "dtrain/buffer.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/ps.h"
#include "dtrain/sdk/random.h"

namespace dtrain::bench::psb {

namespace {

CommOptions ps_options(const PsBenchOptions& o, const std::shared_ptr<Store>& store, Role role, int index,
                       const std::string& token) {
  CommOptions c;
  c.role = role;
  c.rank = c.local_rank = index;
  c.world_size = o.workers;
  c.local_world_size = o.servers + o.workers;
  c.store = store;
  c.config_toml = config_toml(o);
  c.timeout = std::chrono::seconds(300);
  c.name = "bench-ps";
  c.num_servers = o.servers;
  c.num_workers = o.workers;
  c.job_token = token;
  return c;
}

class DtrainImpl : public Impl {
 public:
  explicit DtrainImpl(std::unique_ptr<ps::PsWorker> w) : w_(std::move(w)) {}
  void sparse_pull(const uint64_t* keys, size_t n, size_t dim, float* out) override {
    sparse(dim).pull(keys, n, Buffer(out, n * dim, DType::F32))->wait();
  }
  void sparse_push(const uint64_t* keys, size_t n, size_t dim, const float* grads) override {
    sparse(dim).push(keys, n, Buffer(const_cast<float*>(grads), n * dim, DType::F32))->wait();
  }
  void dense_pull(float* out, size_t count) override { dense(count).pull(Buffer(out, count, DType::F32))->wait(); }
  void dense_push(const float* grads, size_t count) override {
    dense(count).push(Buffer(const_cast<float*>(grads), count, DType::F32))->wait();
  }
  void finish() override { w_->finish(); }

 private:
  static ps::TableConfig config(const std::string& name, ps::TableKind kind, uint64_t dim) {
    ps::TableConfig c;
    c.name = name;
    c.kind = kind;
    c.dim = dim;
    c.optimizer = ps::Optimizer::Sgd;
    c.learning_rate = 0.001;
    return c;
  }
  template <typename Table, typename Make>
  static Table& cached(std::map<size_t, Table>& tables, size_t key, Make make) {
    auto it = tables.find(key);
    if (it == tables.end()) it = tables.emplace(key, make()).first;
    return it->second;
  }
  ps::SparseTable& sparse(size_t dim) {
    return cached(sparse_, dim, [&] {
      return w_->sparse_table(config("sparse_d" + std::to_string(dim), ps::TableKind::Sparse, dim));
    });
  }
  ps::DenseTable& dense(size_t count) {
    return cached(dense_, count, [&] {
      return w_->dense_table(config("dense_" + std::to_string(count), ps::TableKind::Dense, count));
    });
  }
  std::unique_ptr<ps::PsWorker> w_;
  std::map<size_t, ps::SparseTable> sparse_;
  std::map<size_t, ps::DenseTable> dense_;
};

uint64_t key_of(size_t dim, size_t i) { return sdk::splitmix64((uint64_t(dim) << 40) + i); }

void call(Impl& im, const Row& r, const uint64_t* keys, float* vals, const float* grads) {
  switch (r.op) {
    case Op::SparsePull: im.sparse_pull(keys, r.keys, r.dim, vals); return;
    case Op::SparsePush: im.sparse_push(keys, r.keys, r.dim, grads); return;
    case Op::DensePull: im.dense_pull(vals, r.count); return;
    case Op::DensePush: im.dense_push(grads, r.count); return;
  }
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(q * double(v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace

std::unique_ptr<Impl> make_dtrain_impl(const PsBenchOptions& o, const std::shared_ptr<Store>& store, int worker,
                                       const std::string& token) {
  auto backend = PluginRegistry().load(o.backend);
  ps::ModeOptions mode;
  mode.mode = ps::Mode::Async;
  return std::make_unique<DtrainImpl>(
      ps::connect_worker(backend, ps_options(o, store, Role::Worker, worker, token), mode));
}

int server_main(const PsBenchOptions& o, const std::shared_ptr<Store>& store, int index, const std::string& token) {
  auto backend = PluginRegistry().load(o.backend);
  auto server = ps::start_server(backend, ps_options(o, store, Role::Server, index, token));
  server->serve();
  return 0;
}

int worker_main(const PsBenchOptions& o, const std::shared_ptr<Store>& store, int index, const std::string& token) {
  const std::vector<Row> rows = make_rows(o);
  std::vector<std::pair<std::string, std::unique_ptr<Impl>>> impls;
  if (!o.no_dtrain) impls.emplace_back("dtrain", make_dtrain_impl(o, store, index, token));
  if (!o.no_grpc) {
    std::vector<std::string> eps;
    for (int s = 0; s < o.servers; ++s) eps.push_back(store->get_string("echo/" + std::to_string(s)));
    impls.emplace_back("grpc", make_grpc_impl(eps, o.chunk_bytes));
  }
  if (!o.no_redis && store->try_get("redis/0")) {
    std::vector<int> ports;
    for (int s = 0; s < o.servers; ++s) ports.push_back(std::stoi(store->get_string("redis/" + std::to_string(s))));
    impls.emplace_back("redis", make_redis_impl(ports));
  }
  const int W = o.workers;
  auto sync = [&](const std::string& name) {
    if (W > 1) store_barrier(*store, name, index, W);
  };

  std::map<size_t, std::vector<uint64_t>> keys;  // per dim: the most keys any row uses
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::vector<uint64_t>& k = keys[r.dim];
    while (r.sparse() && k.size() < r.keys) k.push_back(key_of(r.dim, k.size()));
    size_t floats = r.sparse() ? r.keys * r.dim : r.count;
    std::vector<float> vals(floats), grads(floats, 0.001f);
    std::vector<size_t> iters(impls.size(), 1);
    for (size_t j = 0; j < impls.size(); ++j) {
      Impl& im = *impls[j].second;
      // Rows exist before they are pulled (Redis answers an absent field with nil).
      if (r.op == Op::SparsePull) im.sparse_push(k.data(), r.keys, r.dim, grads.data());
      if (r.op == Op::DensePull) im.dense_push(grads.data(), r.count);
      call(im, r, k.data(), vals.data(), grads.data());
      auto t0 = Clock::now();
      call(im, r, k.data(), vals.data(), grads.data());
      double one = std::max(seconds_since(t0), 1e-7);
      iters[j] = r.latency ? size_t(o.latency_calls) : std::clamp<size_t>(size_t(o.target_ms * 1e-3 / one), 1, 100000);
    }
    std::vector<std::string> out(impls.size());
    // A throughput trial runs each implementation's calls in kTrialRounds rounds,
    // interleaved (dtrain, gRPC, Redis, then the reverse order, ...), so a
    // pair of trials sees the same stretch of the machine's load. Each round
    // starts with one untimed call (the other implementations ran between).
    const size_t m = impls.size();
    for (int t = 0; t < o.trials; ++t) {
      if (r.latency) {
        for (size_t jj = 0; jj < m; ++jj) {
          const size_t j = t % 2 ? m - 1 - jj : jj;
          Impl& im = *impls[j].second;
          sync(fmt::format("b/{}/{}/{}", i, t, j));
          std::vector<double> each(iters[j]);
          for (auto& e : each) {
            auto t0 = Clock::now();
            call(im, r, k.data(), vals.data(), grads.data());
            e = seconds_since(t0);
          }
          out[j] += fmt::format("{:.9g} {:.9g} ", percentile(each, 0.5), percentile(each, 0.99));
        }
        continue;
      }
      std::vector<double> spent(m, 0);
      for (int round = 0; round < kTrialRounds; ++round) {
        for (size_t jj = 0; jj < m; ++jj) {
          const size_t j = round % 2 ? m - 1 - jj : jj;
          const size_t calls = iters[j] * (round + 1) / kTrialRounds - iters[j] * round / kTrialRounds;
          if (calls == 0) continue;
          Impl& im = *impls[j].second;
          sync(fmt::format("b/{}/{}/{}/{}", i, t, round, j));
          call(im, r, k.data(), vals.data(), grads.data());
          auto t0 = Clock::now();
          for (size_t n = 0; n < calls; ++n) call(im, r, k.data(), vals.data(), grads.data());
          spent[j] += seconds_since(t0);
        }
      }
      for (size_t j = 0; j < m; ++j) out[j] += fmt::format("{:.9g} ", spent[j] / double(iters[j]));
    }
    for (size_t j = 0; j < impls.size(); ++j) {
      store->set(fmt::format("res/{}/{}/{}", i, impls[j].first, index), out[j]);
      store->set(fmt::format("iters/{}/{}", i, impls[j].first), std::to_string(iters[j]));
    }
    if (o.verbose) fmt::print(stderr, "dtrain-bench: worker {}: {} done\n", index, r.label());
  }
  for (auto& im : impls) im.second->finish();
  return 0;
}

}  // namespace dtrain::bench::psb
