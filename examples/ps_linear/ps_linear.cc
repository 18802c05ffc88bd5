// dtrain-ps-linear: logistic regression on the parameter server, through
// dtrain/ps.h only. One sparse table holds a weight row per feature key, one
// dense table the bias and a few dense weights. Each worker generates its own
// examples, deterministically from (seed, worker, step), labelled by a fixed
// "true" model, so the loss falls and a restarted run sees the same data.
//
//   dtrain --server_num 1 --worker_num 2 examples/ps_linear/ps_linear.toml
//   dtrain --server_num 1 --worker_num 2 -- dtrain-ps-linear ps_linear.toml --steps 500
//
// The mode comes from [strategy] (a_sync, a_sync_configs.k_steps): sync and
// async pull, compute and push every step; GEO trains local copies
// (GeoSparseTable, GeoDenseTable) and exchanges deltas every k steps. The
// roles come from dtrain's launcher or from Paddle's PS variables set by hand.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>

#include "dtrain/config.h"
#include "dtrain/error.h"
#include "dtrain/job.h"
#include "dtrain/log.h"
#include "dtrain/ps.h"
#include "dtrain/sdk/random.h"
#include "dtrain/strategy.h"

using namespace dtrain;

namespace {

// The [ps_linear] keys; their defaults are declared once, in add_example_keys.
struct Options {
  int64_t steps = 0;
  int64_t batch_size = 0;
  int64_t log_every = 0;
  int64_t checkpoint_every = 0;
  int64_t num_features = 0;
  int64_t features_per_example = 0;
  int64_t seed = 0;
  double sleep_ms = 0;
  int64_t stall_after = 0;
  int64_t stall_worker = 0;
  std::string stop_file;
};

void add_example_keys(ConfigSchema& s) {
  s.add("ps_linear.steps", ConfigType::Int, "200", "training steps per worker")
      .add("ps_linear.batch_size", ConfigType::Int, "64", "examples per step and worker")
      .add("ps_linear.log_every", ConfigType::Int, "20", "print the mean loss every N steps")
      .add("ps_linear.checkpoint_every", ConfigType::Int, "0", "save a checkpoint every N steps (0: never)")
      .add("ps_linear.num_features", ConfigType::Int, "1000", "sparse feature ids 0..N-1")
      .add("ps_linear.features_per_example", ConfigType::Int, "8", "sparse features active per example")
      .add("ps_linear.seed", ConfigType::Int, "1", "seed of the data and of the true model")
      .add("ps_linear.sleep_ms", ConfigType::Float, "0", "pause after every step (tests)")
      .add("ps_linear.stall_after", ConfigType::Int, "-1", "stall_worker stops pushing after this step (tests)")
      .add("ps_linear.stall_worker", ConfigType::Int, "1", "the worker that stalls")
      .add("ps_linear.stop_file", ConfigType::String, "\"\"",
           "end training at the first step where this file exists (tests; async and GEO modes)");
}

Options read_options(const Config& c) {
  Options o;
  o.steps = c.get_int("ps_linear.steps");
  o.batch_size = c.get_int("ps_linear.batch_size");
  o.log_every = c.get_int("ps_linear.log_every");
  o.checkpoint_every = c.get_int("ps_linear.checkpoint_every");
  o.num_features = c.get_int("ps_linear.num_features");
  o.features_per_example = c.get_int("ps_linear.features_per_example");
  o.seed = c.get_int("ps_linear.seed");
  o.sleep_ms = c.get_float("ps_linear.sleep_ms");
  o.stall_after = c.get_int("ps_linear.stall_after");
  o.stall_worker = c.get_int("ps_linear.stall_worker");
  o.stop_file = c.get_string("ps_linear.stop_file");
  auto positive = [&](const char* key, int64_t v) {
    if (v < 1) {
      ConfigLocation loc = c.location_of(key);
      throw ConfigError(loc.file, loc.line, loc.column, key, std::string(key) + " must be at least 1");
    }
  };
  positive("ps_linear.steps", o.steps);
  positive("ps_linear.batch_size", o.batch_size);
  positive("ps_linear.log_every", o.log_every);
  positive("ps_linear.num_features", o.num_features);
  positive("ps_linear.features_per_example", o.features_per_example);
  return o;
}

using sdk::splitmix64;  // dtrain/sdk/random.h

// A value in [-1, 1] fixed by (seed, what, i).
double unit(uint64_t seed, uint64_t what, uint64_t i) {
  return static_cast<double>(splitmix64(seed * 0x100000001B3ull ^ splitmix64(what * 1000003ull + i)) >> 11) *
             0x1.0p-53 * 2.0 -
         1.0;
}

// One step's examples: feature keys (features_per_example each), dense inputs, labels.
struct Batch {
  std::vector<uint64_t> keys;  // batch_size * features_per_example
  std::vector<float> dense;    // batch_size * dense_dim
  std::vector<float> labels;
};

class Data {
 public:
  Data(const Options& o, int dense_dim) : o_(o), dense_dim_(dense_dim) {}

  static uint64_t key_of(int64_t feature) { return splitmix64(static_cast<uint64_t>(feature) + 1); }

  Batch batch(int worker, int64_t step) const {
    Batch b;
    std::mt19937_64 rng(splitmix64(static_cast<uint64_t>(o_.seed) * 7919 +
                                   splitmix64(static_cast<uint64_t>(worker) << 32) + static_cast<uint64_t>(step)));
    std::uniform_int_distribution<int64_t> feature(0, o_.num_features - 1);
    std::uniform_real_distribution<float> x(-1.f, 1.f);
    const uint64_t seed = static_cast<uint64_t>(o_.seed);
    for (int64_t e = 0; e < o_.batch_size; ++e) {
      double logit = 0.3 * unit(seed, 0, 0);
      for (int64_t k = 0; k < o_.features_per_example; ++k) {
        int64_t f = feature(rng);
        b.keys.push_back(key_of(f));
        logit += 1.5 * unit(seed, 1, static_cast<uint64_t>(f));
      }
      for (int j = 0; j < dense_dim_; ++j) {
        float v = x(rng);
        b.dense.push_back(v);
        logit += 2.0 * unit(seed, 2, static_cast<uint64_t>(j)) * v;
      }
      b.labels.push_back(logit > 0 ? 1.f : 0.f);
    }
    return b;
  }

 private:
  Options o_;
  int dense_dim_;
};

// Forward and backward of the batch: returns the mean log loss; fills the
// gradient of every unique key's row (each element gets the row's gradient:
// a row's weight is the sum of its values) and of the dense values [bias, w...].
double forward_backward(const Batch& b, int64_t per_example, const std::vector<uint64_t>& uniq,
                        const std::unordered_map<uint64_t, size_t>& slot, const std::vector<float>& rows, uint64_t dim,
                        const float* dense, int dense_dim, std::vector<float>& row_grads,
                        std::vector<float>& dense_grads) {
  const size_t n = b.labels.size();
  row_grads.assign(uniq.size() * dim, 0.f);
  dense_grads.assign(static_cast<size_t>(dense_dim) + 1, 0.f);
  double loss = 0;
  for (size_t e = 0; e < n; ++e) {
    double z = dense[0];
    for (int64_t k = 0; k < per_example; ++k) {
      size_t r = slot.at(b.keys[e * per_example + k]);
      for (uint64_t d = 0; d < dim; ++d) z += rows[r * dim + d];
    }
    for (int j = 0; j < dense_dim; ++j) z += dense[1 + j] * b.dense[e * dense_dim + j];
    double p = 1.0 / (1.0 + std::exp(-z));
    double y = b.labels[e];
    loss += -(y * std::log(std::max(p, 1e-12)) + (1 - y) * std::log(std::max(1 - p, 1e-12)));
    float g = static_cast<float>((p - y) / static_cast<double>(n));
    dense_grads[0] += g;
    for (int j = 0; j < dense_dim; ++j) dense_grads[1 + j] += g * b.dense[e * dense_dim + j];
    for (int64_t k = 0; k < per_example; ++k) {
      size_t r = slot.at(b.keys[e * per_example + k]);
      for (uint64_t d = 0; d < dim; ++d) row_grads[r * dim + d] += g;
    }
  }
  return loss / static_cast<double>(n);
}

int run_worker(ps::PsJob& job, const Config& config, const Options& o) {
  ps::PsWorker& w = *job.worker;
  const int me = w.worker_index();
  ps::TableConfig sparse_cfg = ps::TableConfig::from_config(config, "weights");
  ps::TableConfig dense_cfg = ps::TableConfig::from_config(config, "dense");
  ps::SparseTable sparse = w.sparse_table(sparse_cfg);
  ps::DenseTable dense = w.dense_table(dense_cfg);
  const uint64_t dim = sparse.dim();
  const int dense_dim = static_cast<int>(dense.dim()) - 1;
  const ps::ModeOptions& mode = w.mode();
  std::printf("worker %d of %d, %d server(s), mode %s%s, sparse table '%s' dim %llu, dense table '%s' dim %llu\n", me,
              w.num_workers(), w.num_servers(), ps::to_string(mode.mode),
              mode.mode == ps::Mode::Geo ? (" k_steps " + std::to_string(mode.geo_k_steps)).c_str() : "",
              sparse.name().c_str(), static_cast<unsigned long long>(dim), dense.name().c_str(),
              static_cast<unsigned long long>(dense.dim()));
  if (!o.stop_file.empty() && mode.mode == ps::Mode::Sync) {
    ConfigLocation loc = config.location_of("ps_linear.stop_file");
    throw ConfigError(loc.file, loc.line, loc.column, "ps_linear.stop_file",
                      "ps_linear.stop_file needs strategy.a_sync = true: in sync mode every worker must run "
                      "the same steps");
  }
  int64_t start = 0;
  if (int64_t r = w.restored_step(); r >= 0) {
    start = r;
    std::printf("worker %d: restored step %lld from the checkpoint in %s\n", me, static_cast<long long>(r),
                config.get_string("ps.checkpoint_dir").c_str());
  }
  std::fflush(stdout);

  Data data(o, dense_dim);
  const bool geo = mode.mode == ps::Mode::Geo;
  std::optional<ps::GeoSparseTable> geo_sparse;
  std::optional<ps::GeoDenseTable> geo_dense;
  if (geo) {
    geo_sparse.emplace(sparse, w.num_workers(), mode.geo_k_steps);
    geo_dense.emplace(dense, w.num_workers(), mode.geo_k_steps);
  }
  std::vector<float> dense_values(dense.dim()), rows, row_grads, dense_grads;
  double window = 0, first = -1, last = 0;
  int64_t in_window = 0;
  for (int64_t step = start + 1; step <= o.steps; ++step) {
    if (me == o.stall_worker && o.stall_after >= 0 && step > o.stall_after) {
      std::printf("worker %d: stalling after step %lld (--stall_after): no more pushes\n", me,
                  static_cast<long long>(o.stall_after));
      std::fflush(stdout);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    if (!o.stop_file.empty() && std::filesystem::exists(o.stop_file)) {
      std::printf("worker %d: %s exists: stopping after step %lld\n", me, o.stop_file.c_str(),
                  static_cast<long long>(step - 1));
      break;
    }
    Batch b = data.batch(me, step);
    std::vector<uint64_t> uniq;
    std::unordered_map<uint64_t, size_t> slot;
    for (uint64_t k : b.keys)
      if (slot.emplace(k, uniq.size()).second) uniq.push_back(k);
    rows.resize(uniq.size() * dim);
    const float* dv;
    if (geo) {
      geo_sparse->lookup(uniq.data(), uniq.size(), rows.data());
      dv = geo_dense->values();
    } else {
      auto pr = sparse.pull(uniq.data(), uniq.size(), Buffer(rows.data(), rows.size(), DType::F32));
      dense.pull(Buffer(dense_values.data(), dense_values.size(), DType::F32))->wait();
      pr->wait();
      dv = dense_values.data();
    }
    double loss =
        forward_backward(b, o.features_per_example, uniq, slot, rows, dim, dv, dense_dim, row_grads, dense_grads);
    if (geo) {
      geo_sparse->apply(uniq.data(), uniq.size(), row_grads.data());
      float* local = geo_dense->values();
      const float lr = static_cast<float>(dense_cfg.learning_rate);
      for (size_t i = 0; i < dense_grads.size(); ++i) local[i] -= lr * dense_grads[i];
      geo_sparse->step();
      geo_dense->step();
    } else {
      auto sparse_push = sparse.push(uniq.data(), uniq.size(), Buffer(row_grads.data(), row_grads.size(), DType::F32));
      dense.push(Buffer(dense_grads.data(), dense_grads.size(), DType::F32))->wait();
      sparse_push->wait();
    }
    if (first < 0) first = loss;
    window += loss;
    ++in_window;
    if (step % o.log_every == 0 || step == o.steps) {
      last = window / static_cast<double>(in_window);
      std::printf("worker %d: step %lld/%lld loss %.4f\n", me, static_cast<long long>(step),
                  static_cast<long long>(o.steps), last);
      std::fflush(stdout);
      window = 0;
      in_window = 0;
    }
    if (o.checkpoint_every > 0 && step % o.checkpoint_every == 0 && step < o.steps) {
      w.save_checkpoint(step);
      if (me == 0) std::printf("worker %d: checkpoint step %lld saved\n", me, static_cast<long long>(step));
    }
    if (o.sleep_ms > 0) std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(o.sleep_ms * 1000)));
  }
  if (job.collective) {
    float mean = static_cast<float>(last);
    job.collective->allreduce(Buffer(&mean, 1, DType::F32), ReduceOp::Avg)->wait();
    std::printf("worker %d: mean final loss over %d workers %.4f\n", me, w.num_workers(), mean);
  }
  std::printf("worker %d: final loss %.4f (first %.4f)\n", me, last, first);
  std::fflush(stdout);
  w.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain-ps-linear: logistic regression on the parameter server"};
  std::string job_file, tag;
  std::vector<std::string> overrides;
  std::optional<int64_t> steps, checkpoint_every, log_every, stall_after, stall_worker;
  std::optional<double> sleep_ms;
  app.add_option("job", job_file, "job file (TOML)")->required();
  app.add_option("-o", overrides, "override a job-file key: -o ps_linear.steps=500 (repeatable)")
      ->allow_extra_args(false);  // one value per -o: `-o a=1 JOB.toml` keeps JOB.toml positional
  app.add_option("--steps", steps, "training steps per worker ([ps_linear] steps)");
  app.add_option("--checkpoint_every", checkpoint_every, "save a checkpoint every N steps ([ps] checkpoint_dir)");
  app.add_option("--log_every", log_every, "print the mean loss every N steps");
  app.add_option("--sleep_ms", sleep_ms, "pause after every step");
  app.add_option("--stall_after", stall_after, "the --stall_worker stops pushing after this step (tests)");
  app.add_option("--stall_worker", stall_worker, "the worker that stalls (default 1)");
  app.add_option("--tag", tag, "ignored; lets a test find its processes");
  CLI11_PARSE(app, argc, argv);
  std::string who = "dtrain-ps-linear";
  try {
    Config config = Config::from_file(job_file, overrides);
    ConfigSchema schema;
    add_job_keys(schema);
    add_strategy_keys(schema);
    ps::add_ps_keys(schema);
    add_example_keys(schema);
    config.validate(schema);
    Options o = read_options(config);
    if (steps) o.steps = *steps;
    if (checkpoint_every) o.checkpoint_every = *checkpoint_every;
    if (log_every) o.log_every = *log_every;
    if (sleep_ms) o.sleep_ms = *sleep_ms;
    if (stall_after) o.stall_after = *stall_after;
    if (stall_worker) o.stall_worker = *stall_worker;

    RoleInfo role = resolve_role(&config);
    who += role.role == Role::Server ? " server " + std::to_string(role.server_index)
                                     : " worker " + std::to_string(role.rank);
    std::printf("%s: pid %d, %s\n", who.c_str(), getpid(), role.describe().c_str());
    std::fflush(stdout);
    ps::PsJob job = ps::join_ps(config, role);
    if (job.server) {
      job.server->serve();
      std::printf("%s: served; exiting\n", who.c_str());
      return 0;
    }
    return run_worker(job, config, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
    return 1;
  }
}
