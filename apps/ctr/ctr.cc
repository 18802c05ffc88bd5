#include "ctr/ctr.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/tensorboard.h"
#include "common/trainer.h"
#include "ctr/criteo.h"
#include "ctr/gen.h"
#include "ctr/model.h"
#include "dtrain/error.h"
#include "dtrain/fleet/ps.h"
#include "dtrain/strategy.h"

namespace dtrain::apps {

namespace fs = std::filesystem;
using namespace ctr;
using Clock = std::chrono::steady_clock;

const ConfigTable<CtrOptions>& ctr_table() {
  static const ConfigTable<CtrOptions> table = [] {
    using O = CtrOptions;
    ConfigTable<O> t;
    t.add("data.format", &O::format, "criteo | slot (PaddleRec)");
    t.add("data.train_files", &O::train_files, "training files (default: <dir>/train.txt)");
    t.add("data.test_files", &O::test_files, "test files (default: <dir>/test.txt)");
    t.add("data.generate", &O::generate, "generate click logs into dir when the files are missing");
    t.add("data.dir", &O::dir, "where generated logs go");
    t.add("data.gen_train_lines", &O::gen_train_lines, "generated training lines").at_least(1);
    t.add("data.gen_test_lines", &O::gen_test_lines, "generated test lines").at_least(1);
    t.add("data.gen_seed", &O::gen_seed, "the teacher model's seed");
    t.add("data.on_error", &O::on_error, "malformed lines: skip (and count) | fail");
    t.add("data.limit_train", &O::limit_train, "use only the first N training lines (0: all)");
    t.add("data.limit_test", &O::limit_test, "use only the first N test lines (0: all)");
    t.add("model.embedding_dim", &O::embedding_dim, "deep embedding width").at_least(1);
    t.add("model.hidden", &O::hidden, "MLP layer sizes");
    t.add("model.interaction", &O::interaction,
          "none (the MLP sees the concatenated embeddings) | dot (and every pair's dot product)");
    t.add("train.geo_sparse_lr", &O::geo_sparse_lr,
          "GEO: the SGD rate of the wide and deep tables' local copies (in place of their learning_rate)");
    t.add("train.geo_dense_lr", &O::geo_dense_lr, "GEO: the SGD rate of the MLP's local copy");
    t.add("debug.sleep_ms", &O::sleep_ms, "sleep after every training step (tests: a kill lands mid-run)");
    t.add("train.loss_reduction", &O::loss_reduction,
          "gradients pushed: sum (over the global batch) | mean | auto (sum in sync and async, mean in GEO)");
    return t;
  }();
  return table;
}

void add_ctr_keys(ConfigSchema& s) {
  ps::add_ps_keys(s);
  ctr_table().declare(s);
}

namespace {

Config load_ctr_config(const std::string& path, const std::vector<std::string>& overrides) {
  return load_job_config(path, overrides, add_ctr_keys, "output/ctr");
}

std::vector<std::string> files_or(std::vector<std::string> files, const std::string& fallback) {
  if (files.empty()) files.push_back(fallback);
  return files;
}

ReaderOptions reader_options(const Config& c, int rank, int world, int64_t batch, int64_t limit) {
  const CtrOptions app = ctr_table().read(c);
  ReaderOptions o;
  o.format = parse_format(app.format);
  if (app.on_error != "skip" && app.on_error != "fail")
    config_error(c, "data.on_error", "must be \"skip\" or \"fail\"");
  o.on_error = app.on_error == "skip" ? OnError::Skip : OnError::Fail;
  o.rank = rank;
  o.world = world;
  o.batch_size = batch;
  o.limit = limit;
  o.prefetch = static_cast<int>(trainer_table().read(c).prefetch);
  return o;
}

// The model and its tables, on the servers (or the in-process one).
struct Net {
  fleet::SparseEmbedding wide{nullptr}, deep{nullptr};
  WideDeep model{nullptr};
  std::shared_ptr<fleet::PsOptimizer> opt;
  int64_t dim = 8;

  explicit Net(const Config& c) {
    const CtrOptions app = ctr_table().read(c);
    dim = app.embedding_dim;
    auto wide_cfg = fleet::sparse_table_config("wide");
    auto deep_cfg = fleet::sparse_table_config("deep");
    if (wide_cfg.dim != 1) config_error(c, "ps.tables.wide.dim", "the wide table has one value per feature (dim = 1)");
    if (static_cast<int64_t>(deep_cfg.dim) != dim)
      config_error(c, "ps.tables.deep.dim", "must equal model.embedding_dim (" + std::to_string(dim) + ")");
    wide = fleet::SparseEmbedding(wide_cfg);
    deep = fleet::SparseEmbedding(deep_cfg);
    if (app.interaction != "none" && app.interaction != "dot")
      config_error(c, "model.interaction", "must be \"none\" or \"dot\"");
    model = WideDeep(dim, app.hidden, app.interaction == "dot");
    opt = fleet::ps_optimizer({wide, deep}, model.ptr(), "dense");
  }

  torch::Tensor logits(const ctr::Batch& b) {
    const auto n = static_cast<int64_t>(b.size());
    auto keys = torch::from_blob(const_cast<uint64_t*>(b.keys.data()), {n, kSparse}, torch::kLong);
    auto dense = torch::from_blob(const_cast<float*>(b.dense.data()), {n, kDense}, torch::kFloat);
    return model->forward(wide->forward(keys), deep->forward(keys), dense);
  }
};

void evaluate_into(Net& net, const std::vector<std::string>& files, const ReaderOptions& ro, EvalStats* stats) {
  torch::NoGradGuard no_grad;
  Reader reader(files, ro);
  ctr::Batch b;
  while (reader.next(&b)) {
    if (b.size() == 0) continue;
    auto p = torch::sigmoid(net.logits(b)).contiguous();
    stats->add(p.data_ptr<float>(), b.labels.data(), b.size());
  }
}

std::string teacher_line(const std::string& dir) {
  std::ifstream in(dir + "/teacher.toml");
  std::string line, out;
  while (std::getline(in, line))
    if (line.rfind("teacher_auc", 0) == 0) out = line;
  return out;
}

void ensure_data(const Config& c, const std::vector<std::string>& train, const std::vector<std::string>& test) {
  bool missing = false;
  for (const auto& f : train) missing |= !fs::exists(f);
  for (const auto& f : test) missing |= !fs::exists(f);
  if (!missing || fleet::worker_index() != 0) return;
  const CtrOptions app = ctr_table().read(c);
  if (!app.generate) return;  // the reader names the missing file
  GenOptions g;
  g.dir = app.dir;
  g.train_lines = app.gen_train_lines;
  g.test_lines = app.gen_test_lines;
  g.seed = static_cast<uint64_t>(app.gen_seed);
  auto t0 = Clock::now();
  auto r = generate(g);
  log_line(
      fmt::format("ctr: generated {} training and {} test lines in {} ({:.1f} s): teacher auc {:.4f} "
                  "logloss {:.4f} ctr {:.3f}",
                  g.train_lines, g.test_lines, g.dir, std::chrono::duration<double>(Clock::now() - t0).count(),
                  r.teacher_auc, r.teacher_logloss, r.ctr));
}

// GEO trains local copies with plain SGD at each table's learning_rate (and
// the servers accept only optimizer = "sgd" then): the tables' rules and
// rates (for the servers' AdaGrad and Adam) give way to SGD at [train]
// geo_sparse_lr and geo_dense_lr.
Config with_geo_rates(const Config& c) {
  Config job = c;
  if (StrategyOptions::from_config(c).ps_mode.mode != ps::Mode::Geo) return job;
  const CtrOptions app = ctr_table().read(c);
  const std::string sparse = fmt::format("{:.6e}", app.geo_sparse_lr);
  job.set_literal("ps.tables.wide.learning_rate", sparse);
  job.set_literal("ps.tables.deep.learning_rate", sparse);
  job.set_literal("ps.tables.dense.learning_rate", fmt::format("{:.6e}", app.geo_dense_lr));
  for (const char* t : {"wide", "deep", "dense"})
    job.set_literal(std::string("ps.tables.") + t + ".optimizer", "\"sgd\"");
  return job;
}

void train_impl(const Config& job);

// A failing worker leaves the job before its error reaches main: Fleet's
// PsWorker then tells the servers while gRPC is still loaded (at exit it may
// not be), and runs no save_on_exit barrier that would wait for the others.
void train(const Config& job) {
  try {
    train_impl(job);
  } catch (...) {
    try {
      fleet::shutdown();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dtrain-ctr: leaving the job failed too: %s\n", e.what());
    }
    throw;
  }
}

void serve() {
  fleet::init_server();
  log_line(fmt::format("ctr: server {} of {} serving (pid {})", fleet::server_index(), fleet::server_num(),
                       static_cast<long>(::getpid())));
  fleet::run_server();
  log_line("ctr: server done");
}

// What a worker trains: its files, sizes and schedule, read once from the job.
struct Plan {
  int rank = 0, world = 1;
  std::string dir;
  std::vector<std::string> train_files, test_files;
  int64_t batch = 0, epochs = 0, log_every = 0, ckpt_every = 0, sleep_ms = 0, kill_at = 0;
  int64_t limit_train = 0, limit_test = 0;
  int64_t lines = 0, per_worker = 0, steps_per_epoch = 0, total_steps = 0;

  explicit Plan(const Config& c) : rank(fleet::worker_index()), world(fleet::worker_num()) {
    const CtrOptions app = ctr_table().read(c);
    const TrainOptions train = trainer_table().read(c);
    dir = app.dir;
    train_files = files_or(app.train_files, dir + "/train.txt");
    test_files = files_or(app.test_files, dir + "/test.txt");
    ensure_data(c, train_files, test_files);
    fleet::barrier_worker();
    batch = train.batch_size;
    epochs = train.epochs;
    log_every = train.log_every_steps;
    ckpt_every = train.checkpoint_every_steps;
    sleep_ms = app.sleep_ms;
    kill_at = train.kill_at_step;
    limit_train = app.limit_train;
    limit_test = app.limit_test;
    lines = count_lines(train_files, limit_train);
    per_worker = lines / world;
    if (per_worker == 0)
      throw InvalidUsage("ctr: " + std::to_string(lines) + " training lines for " + std::to_string(world) + " workers");
    steps_per_epoch = (per_worker + batch - 1) / batch;
    total_steps = steps_per_epoch * epochs;
  }
};

// The servers' per-row AdaGrad wants per-example gradients summed over the
// global batch (its initial_g2sum is then in examples); a sync step averages
// the workers' pushes, so each worker scales by the worker count. GEO trains
// local copies with SGD, whose rate fits the mean. Returns the factor per
// example (0: the batch mean) and sets *reduction to the rule chosen.
double grad_scale_per_example(const Config& c, ps::Mode mode, int world, std::string* reduction) {
  *reduction = ctr_table().read(c).loss_reduction;
  if (*reduction != "auto" && *reduction != "sum" && *reduction != "mean")
    config_error(c, "train.loss_reduction", "must be \"sum\", \"mean\" or \"auto\"");
  if (*reduction == "auto") *reduction = mode == ps::Mode::Geo ? "mean" : "sum";
  return *reduction == "mean" ? 0.0 : (mode == ps::Mode::Sync ? static_cast<double>(world) : 1.0);
}

// Time and loss since the last progress line, and examples since the start.
struct Progress {
  Clock::time_point start = Clock::now();
  double t_pull = 0, t_push = 0, t_compute = 0, loss_sum = 0;
  int64_t loss_n = 0, examples = 0, done = 0;

  void log(const Plan& p, int64_t epoch, int64_t step, EventWriter* tb) {
    const double el = std::chrono::duration<double>(Clock::now() - start).count();
    const double eps = static_cast<double>(examples) / el * p.world;
    const double eta = el / static_cast<double>(done) * static_cast<double>(p.total_steps - step);
    const double avg = loss_n ? loss_sum / static_cast<double>(loss_n) : 0.0;
    log_line(
        fmt::format("ctr: epoch {}/{} step {}/{} loss {:.4f} examples/s {:.0f} (all workers) per step: "
                    "pull {:.2f} ms compute {:.2f} ms push {:.2f} ms ETA {}",
                    epoch + 1, p.epochs, step, p.total_steps, avg, eps, 1e3 * t_pull / done, 1e3 * t_compute / done,
                    1e3 * t_push / done, hms(eta)));
    if (tb) {
      tb->add_scalar("train/loss", static_cast<float>(avg), step);
      tb->add_scalar("train/examples_per_s", static_cast<float>(eps), step);
    }
    loss_sum = 0;
    loss_n = 0;
  }
};

torch::Tensor keys_of(const ctr::Batch& b) {
  return torch::from_blob(const_cast<uint64_t*>(b.keys.data()), {static_cast<int64_t>(b.size()), kSparse},
                          torch::kLong);
}

// One batch: pull its rows (forward of the embeddings), start pulling the
// next batch's (async mode; next may be null), the dense part and backward,
// then the optimizer's push; timings go into progress.
void train_batch(Net& net, const ctr::Batch& b, const ctr::Batch* next, double scale_per_example, Progress& progress) {
  const auto n = static_cast<int64_t>(b.size());
  auto t0 = Clock::now();
  auto keys = keys_of(b);
  auto wide_rows = net.wide->forward(keys);
  auto deep_rows = net.deep->forward(keys);
  if (next) {
    auto next_keys = keys_of(*next);
    net.wide->prefetch(next_keys);
    net.deep->prefetch(next_keys);
  }
  auto t1 = Clock::now();
  auto dense = torch::from_blob(const_cast<float*>(b.dense.data()), {n, kDense}, torch::kFloat);
  auto labels = torch::from_blob(const_cast<float*>(b.labels.data()), {n}, torch::kFloat);
  auto loss = torch::binary_cross_entropy_with_logits(net.model->forward(wide_rows, deep_rows, dense), labels);
  if (n > 0) {
    if (scale_per_example > 0)
      (loss * (scale_per_example * static_cast<double>(n))).backward();
    else
      loss.backward();
  }
  auto t2 = Clock::now();
  net.opt->step();
  net.opt->zero_grad();
  auto t3 = Clock::now();
  progress.t_pull += std::chrono::duration<double>(t1 - t0).count();
  progress.t_compute += std::chrono::duration<double>(t2 - t1).count();
  progress.t_push += std::chrono::duration<double>(t3 - t2).count();
  if (n > 0) progress.loss_sum += loss.item<double>() * static_cast<double>(n);
  progress.loss_n += n;
  progress.examples += n;
  ++progress.done;
}

// After a step: progress line, checkpoint, the tests' sleep and kill.
void after_step(const Plan& p, int64_t epoch, int64_t step, Progress& progress, EventWriter* tb) {
  if (step % p.log_every == 0 || step == p.total_steps) progress.log(p, epoch, step, tb);
  if (p.ckpt_every > 0 && step % p.ckpt_every == 0) {
    fleet::ps_worker().save_checkpoint(step);
    if (p.rank == 0) log_line(fmt::format("ctr: checkpoint step {} saved", step));
  }
  if (p.sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(p.sleep_ms));
  if (p.kill_at == step && p.rank == 0) {
    log_line(fmt::format("ctr: debug.kill_at_step {}: exiting", step));
    std::fflush(stdout);
    std::_Exit(3);
  }
}

// Every worker's pushes are in before anyone evaluates, and the dense
// weights are the servers' final ones: the evaluation scores the model that
// [ps] save_on_exit saves (GEO: the workers' local copies).
void evaluate_and_report(const Config& c, const Plan& p, Net& net, ps::Mode mode, const Progress& progress,
                         int64_t step, EventWriter* tb) {
  const double train_s = std::chrono::duration<double>(Clock::now() - progress.start).count();
  fleet::barrier_worker();
  if (mode != ps::Mode::Geo) net.opt->dense()->pull();
  EvalStats stats;
  auto ro = reader_options(c, p.rank, p.world, 4096, p.limit_test);
  evaluate_into(net, p.test_files, ro, &stats);
  const double auc = fleet::metrics::auc(stats.pos, stats.neg);
  std::vector<double> ll{stats.loss_sum, stats.count};
  fleet::metrics::sum(ll);
  const double logloss = ll[1] > 0 ? ll[0] / ll[1] : 0.0;
  log_line(
      fmt::format("ctr: test auc {:.4f} logloss {:.4f} over {:.0f} examples ({}); trained {:.1f} s, "
                  "{:.0f} examples/s",
                  auc, logloss, ll[1], teacher_line(p.dir), train_s,
                  static_cast<double>(progress.examples) * p.world / std::max(train_s, 1e-9)));
  if (tb) {
    tb->add_scalar("test/auc", static_cast<float>(auc), step);
    tb->add_scalar("test/logloss", static_cast<float>(logloss), step);
    tb->flush();
  }
}

void train_impl(const Config& job) {
  const Config c = with_geo_rates(job);
  fleet::InitOptions io;
  io.is_collective = false;
  io.config = std::make_shared<Config>(c);
  fleet::init(io);
  if (fleet::is_server()) return serve();
  const TrainOptions train = trainer_table().read(c);
  set_worker_threads(static_cast<int>(train.threads));
  torch::manual_seed(static_cast<uint64_t>(train.seed));
  const Plan p(c);
  Net net(c);
  auto& worker = fleet::ps_worker();
  const ps::Mode mode = worker.mode().mode;
  std::string reduction;
  const double scale = grad_scale_per_example(c, mode, p.world, &reduction);
  int64_t step = 0;
  if (int64_t restored = worker.restored_step(); restored >= 0) {
    step = restored;
    log_line(fmt::format("ctr: worker {} restored step {} from the checkpoint", p.rank, step));
  }
  std::unique_ptr<EventWriter> tb;
  if (!train.tensorboard.empty() && p.rank == 0) tb = std::make_unique<EventWriter>(train.tensorboard);
  log_line(
      fmt::format("ctr: worker {}/{} mode {} ({}), {} lines, {} steps per epoch, batch {}, model wide&deep "
                  "emb {} hidden [{}], gradients {}",
                  p.rank, p.world, ps::to_string(mode), worker.mode().geo_k_steps, p.lines, p.steps_per_epoch, p.batch,
                  net.dim, fmt::join(ctr_table().read(c).hidden, ", "), reduction));

  Progress progress;
  for (int64_t epoch = step / p.steps_per_epoch; epoch < p.epochs; ++epoch) {
    auto ro = reader_options(c, p.rank, p.world, p.batch, p.limit_train);
    ro.per_worker = p.per_worker;
    Reader reader(p.train_files, ro);
    // One batch read ahead, so its rows can be pulled while this one trains.
    ctr::Batch b, next;
    bool have = reader.next(&b);
    for (int64_t i = 0; have; ++i) {
      const bool have_next = reader.next(&next);
      if (epoch * p.steps_per_epoch + i >= step) {  // else resumed: already trained
        train_batch(net, b, have_next ? &next : nullptr, scale, progress);
        after_step(p, epoch, ++step, progress, tb.get());
      }
      std::swap(b, next);
      have = have_next;
    }
    if (reader.skipped() > 0)
      log_line(fmt::format("ctr: worker {} skipped {} malformed lines (first: {})", p.rank, reader.skipped(),
                           reader.first_error()));
  }
  evaluate_and_report(c, p, net, mode, progress, step, tb.get());
  fleet::stop_worker();
}

int predict(const Config& c, const std::string& model_dir, const std::string& input, const std::string& output) {
  fleet::init_standalone(std::make_shared<Config>(c));
  Net net(c);
  std::string dir = model_dir;
  if (fs::exists(dir + "/final")) {
    dir += "/final";  // [ps] save_on_exit's save: the end of training
  } else if (fs::exists(dir + "/LATEST")) {
    std::ifstream in(dir + "/LATEST");
    std::string name;
    std::getline(in, name);
    dir += "/" + name;
  }
  net.wide->table().load(dir)->wait();
  net.deep->table().load(dir)->wait();
  net.opt->dense()->load(dir);
  auto ro = reader_options(c, 0, 1, 4096, 0);
  torch::NoGradGuard no_grad;
  Reader reader({input}, ro);
  std::ofstream out(output.empty() ? "/dev/stdout" : output);
  if (!out) throw InvalidUsage("cannot write '" + output + "'");
  EvalStats stats;
  ctr::Batch b;
  while (reader.next(&b)) {
    if (b.size() == 0) continue;
    auto p = torch::sigmoid(net.logits(b)).contiguous();
    const float* pp = p.data_ptr<float>();
    for (size_t i = 0; i < b.size(); ++i) out << fmt::format("{:.6f}\n", pp[i]);
    stats.add(pp, b.labels.data(), b.size());
  }
  std::fprintf(stderr, "dtrain-ctr predict: %.0f lines from %s scored with %s: auc %.4f logloss %.4f\n", stats.count,
               input.c_str(), dir.c_str(), fleet::metrics::auc_of_buckets(stats.pos, stats.neg),
               stats.count > 0 ? stats.loss_sum / stats.count : 0.0);
  return 0;
}

}  // namespace

int ctr_main(int argc, char** argv) {
  CLI::App cli{"dtrain-ctr: wide & deep click-through-rate training on the parameter server"};
  cli.require_subcommand(0, 1);
  std::string job_file, model_dir, input, output;
  std::vector<std::string> overrides;
  cli.add_option("job", job_file, "job file (TOML), e.g. apps/ctr.toml");
  cli.add_option("-o,--override", overrides, "override a key: -o train.epochs=2 (repeatable)");
  GenOptions g;
  auto* gen = cli.add_subcommand("gen", "write Criteo-format click logs from a teacher model");
  gen->add_option("--dir", g.dir, "output folder")->required();
  gen->add_option("--train_lines", g.train_lines, "training lines");
  gen->add_option("--test_lines", g.test_lines, "test lines");
  gen->add_option("--seed", g.seed, "teacher seed");
  gen->add_option("--bad_lines", g.bad_lines, "malformed lines to put into train.txt (for tests)");
  auto* pred = cli.add_subcommand("predict", "score a Criteo-format file with saved tables, one process");
  pred->add_option("job", job_file, "the job file the model was trained with")->required();
  pred->add_option("-o,--override", overrides, "override a key (repeatable)");
  pred->add_option("--model", model_dir, "a checkpoint folder ([ps] checkpoint_dir or one step-N in it)")->required();
  pred->add_option("--input", input, "Criteo-format file")->required();
  pred->add_option("--output", output, "one probability per line (default: stdout)");
  CLI11_PARSE(cli, argc, argv);
  try {
    if (*gen) {
      auto r = generate(g);
      std::printf("teacher auc %.4f logloss %.4f ctr %.3f (%s/teacher.toml)\n", r.teacher_auc, r.teacher_logloss, r.ctr,
                  g.dir.c_str());
      return 0;
    }
    if (job_file.empty()) throw InvalidUsage("no job file given (dtrain-ctr JOB.toml)");
    Config cfg = load_ctr_config(job_file, overrides);
    if (*pred) return predict(cfg, model_dir, input, output);
    train(cfg);
    return 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "dtrain-ctr: error: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-ctr: error: %s\n", e.what());
  }
  return 1;
}

}  // namespace dtrain::apps
