#include "common/trainer.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/data.h"
#include "common/ddp.h"
#include "common/models.h"
#include "common/tensorboard.h"
#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/log.h"

namespace fs = std::filesystem;

namespace dtrain::apps {

void add_cls_keys(ConfigSchema& s) {
  s.add("data.dataset", ConfigType::String, "\"fashion-mnist\"", "fashion-mnist | list");
  s.add("data.dir", ConfigType::String, "\"/usr/share/datasets/fashion-mnist\"", "IDX files folder");
  s.add("data.train_list", ConfigType::String, "", "PaddleClas list file for training");
  s.add("data.val_list", ConfigType::String, "", "PaddleClas list file for evaluation");
  s.add("data.root", ConfigType::String, "", "folder the list files' paths are relative to");
  s.add("data.image_size", ConfigType::Int, "32", "list images are resized to this square size");
  s.add("data.channels", ConfigType::Int, "3", "1 (grey) or 3 (RGB) for list images");
  s.add("data.num_classes", ConfigType::Int, "10", "classes of a list dataset");
  s.add("data.limit_train", ConfigType::Int, "0", "use only the first N training images (0: all)");
  s.add("data.limit_eval", ConfigType::Int, "0", "use only the first N evaluation images (0: all)");
  s.add("data.prefetch", ConfigType::Int, "4", "batches prepared ahead by the loader thread");
  s.add("augment.crop_padding", ConfigType::Int, "2", "random crop after padding (0: off)");
  s.add("augment.flip", ConfigType::Bool, "true", "random horizontal flip");
  s.add("augment.mean", ConfigType::Float, "0.286", "normalisation mean (all channels)");
  s.add("augment.std", ConfigType::Float, "0.353", "normalisation std (all channels)");
  s.add("model.name", ConfigType::String, "\"resnet20\"", "resnet20 | resnet32 | resnet56 | resnet18 | resnet50");
  s.add("model.width", ConfigType::Float, "1.0", "channel multiplier");
  s.add("train.epochs", ConfigType::Int, "10", "");
  s.add("train.batch_size", ConfigType::Int, "128", "per worker");
  s.add("train.eval_batch_size", ConfigType::Int, "500", "per worker");
  s.add("train.lr", ConfigType::Float, "0.1", "peak learning rate");
  s.add("train.momentum", ConfigType::Float, "0.9", "");
  s.add("train.weight_decay", ConfigType::Float, "1e-4", "L2 decay");
  s.add("train.warmup_epochs", ConfigType::Float, "0", "linear warm-up length");
  s.add("train.schedule", ConfigType::String, "\"cosine\"", "cosine | piecewise");
  s.add("train.milestones", ConfigType::IntList, "[]", "piecewise: epochs where lr is multiplied by gamma");
  s.add("train.gamma", ConfigType::Float, "0.1", "piecewise decay factor");
  s.add("train.seed", ConfigType::Int, "42", "shared by all workers");
  s.add("train.threads", ConfigType::Int, "1", "intra-op threads per worker");
  s.add("train.max_steps", ConfigType::Int, "0", "stop after this many micro-steps (0: no limit)");
  s.add("eval.every_epochs", ConfigType::Int, "1", "evaluate every N epochs (0: only at the end)");
  s.add("checkpoint.dir", ConfigType::String, "\"output/cls\"", "");
  s.add("checkpoint.every_epochs", ConfigType::Int, "1", "0: only at the end");
  s.add("checkpoint.every_steps", ConfigType::Int, "0", "also every N micro-steps (0: off)");
  s.add("checkpoint.resume", ConfigType::String, "false", "false | true (latest in dir) | a checkpoint path");
  s.add("log.every_steps", ConfigType::Int, "50", "progress line every N steps");
  s.add("log.tensorboard", ConfigType::String, "\"\"", "folder for TensorBoard event files");
  s.add("debug.dump_params", ConfigType::String, "\"\"", "write raw parameters at the end; {rank} is replaced");
  s.add("debug.kill_at_step", ConfigType::Int, "0", "SIGKILL every worker after this micro-step, first attempt only (tests)");
}

Config load_cls_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config cfg = Config::from_file(path, overrides);
  if (cfg.has("checkpoint.resume")) {
    try {
      bool b = cfg.get_bool("checkpoint.resume");
      cfg.set_literal("checkpoint.resume", b ? "\"true\"" : "\"false\"");
    } catch (const ConfigError&) {
    }
  }
  ConfigSchema schema;
  add_job_keys(schema);
  add_strategy_keys(schema);
  add_cls_keys(schema);
  cfg.validate(schema);
  return cfg;
}

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void bad(const Config& c, const std::string& key, const std::string& msg) {
  auto loc = c.location_of(key);
  throw ConfigError(loc.file, loc.line, loc.column, key, msg);
}

int64_t positive(const Config& c, const std::string& key, int64_t fallback) {
  int64_t v = c.get_int(key, fallback);
  if (v < 1) bad(c, key, "must be >= 1, got " + std::to_string(v));
  return v;
}

std::string hms(double s) {
  if (!(s >= 0) || s > 1e7) return "-";
  int64_t t = static_cast<int64_t>(s + 0.5);
  return fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60);
}

void fsync_path(const std::string& path, bool dir) {
  int fd = ::open(path.c_str(), dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw IoError("cannot open '" + path + "' to sync it: " + std::strerror(errno));
  ::fsync(fd);
  ::close(fd);
}

struct Trainer {
  Config cfg;
  Job job;
  int rank = 0, world = 1;

  std::shared_ptr<Dataset> train_set, eval_set;
  AugmentOptions aug;
  torch::nn::AnyModule any;
  std::shared_ptr<torch::nn::Module> model;
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<torch::optim::SGD> opt;
  std::unique_ptr<EventWriter> tb;

  int64_t epochs = 0, batch = 0, eval_batch = 0, log_every = 0, steps_per_epoch = 0, k_merge = 1;
  uint64_t seed = 0;
  double base_lr = 0, warmup_epochs = 0, gamma = 0.1;
  std::string schedule;
  std::vector<int64_t> milestones;
  std::string ckpt_dir;

  // Progress: the next micro-step to run.
  int64_t epoch = 0, batch_in_epoch = 0, global_step = 0;

  void log(const std::string& line) {
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
  }

  double lr_at(int64_t micro_step) const {
    double opt_steps_per_epoch = double(steps_per_epoch) / k_merge;
    double t = double(micro_step / k_merge);
    double total = opt_steps_per_epoch * epochs;
    double warm = warmup_epochs * opt_steps_per_epoch;
    if (t < warm) return base_lr * (t + 1) / warm;
    if (schedule == "piecewise") {
      double e = t / opt_steps_per_epoch, lr = base_lr;
      for (int64_t m : milestones)
        if (e >= double(m)) lr *= gamma;
      return lr;
    }
    double p = total > warm ? (t - warm) / (total - warm) : 1.0;
    return 0.5 * base_lr * (1.0 + std::cos(M_PI * std::min(1.0, p)));
  }

  void setup() {
    rank = job.role.rank;
    world = job.role.world_size;
    torch::set_num_threads(static_cast<int>(positive(cfg, "train.threads", 1)));
    seed = static_cast<uint64_t>(cfg.get_int("train.seed", 42));
    torch::manual_seed(seed);

    std::string ds = cfg.get_string("data.dataset", "fashion-mnist");
    size_t limit_train = static_cast<size_t>(std::max<int64_t>(0, cfg.get_int("data.limit_train", 0)));
    size_t limit_eval = static_cast<size_t>(std::max<int64_t>(0, cfg.get_int("data.limit_eval", 0)));
    if (ds == "fashion-mnist" || ds == "mnist") {
      std::string dir = cfg.get_string("data.dir", "/usr/share/datasets/fashion-mnist");
      train_set = load_idx_dataset(dir, true, limit_train);
      eval_set = load_idx_dataset(dir, false, limit_eval);
    } else if (ds == "list") {
      int classes = static_cast<int>(positive(cfg, "data.num_classes", 10));
      int size = static_cast<int>(positive(cfg, "data.image_size", 32));
      int ch = static_cast<int>(cfg.get_int("data.channels", 3));
      std::string root = cfg.get_string("data.root", "");
      std::string tl = cfg.get_string("data.train_list"), vl = cfg.get_string("data.val_list");
      if (tl.empty()) bad(cfg, "data.train_list", "data.dataset = \"list\" needs data.train_list");
      if (vl.empty()) bad(cfg, "data.val_list", "data.dataset = \"list\" needs data.val_list");
      train_set = load_list_dataset(tl, root, classes, size, ch, limit_train);
      eval_set = load_list_dataset(vl, root, classes, size, ch, limit_eval);
    } else {
      bad(cfg, "data.dataset", "unknown dataset '" + ds + "'; known: fashion-mnist, mnist, list");
    }
    aug.crop_padding = static_cast<int>(cfg.get_int("augment.crop_padding", 2));
    aug.flip = cfg.get_bool("augment.flip", true);
    aug.mean = static_cast<float>(cfg.get_float("augment.mean", 0.286));
    aug.std = static_cast<float>(cfg.get_float("augment.std", 0.353));
    if (!(aug.std > 0)) bad(cfg, "augment.std", "must be > 0");

    std::string name = cfg.get_string("model.name", "resnet20");
    try {
      any = make_model(name, cfg.get_float("model.width", 1.0), train_set->channels(), train_set->num_classes());
    } catch (const InvalidUsage& e) {
      bad(cfg, "model.name", e.what());
    }
    model = any.ptr();

    StrategyOptions so = StrategyOptions::from_config(cfg);
    k_merge = so.gradient_merge_k_steps;
    dp = std::make_unique<DataParallel>(model, job.comm, so);

    base_lr = cfg.get_float("train.lr", 0.1);
    opt = std::make_unique<torch::optim::SGD>(model->parameters(),
                                              torch::optim::SGDOptions(base_lr)
                                                  .momentum(cfg.get_float("train.momentum", 0.9))
                                                  .weight_decay(cfg.get_float("train.weight_decay", 1e-4)));
    epochs = positive(cfg, "train.epochs", 10);
    batch = positive(cfg, "train.batch_size", 128);
    eval_batch = positive(cfg, "train.eval_batch_size", 500);
    log_every = positive(cfg, "log.every_steps", 50);
    warmup_epochs = cfg.get_float("train.warmup_epochs", 0);
    schedule = cfg.get_string("train.schedule", "cosine");
    if (schedule != "cosine" && schedule != "piecewise")
      bad(cfg, "train.schedule", "must be \"cosine\" or \"piecewise\", got \"" + schedule + "\"");
    if (cfg.has("train.milestones")) milestones = cfg.get_int_list("train.milestones");
    gamma = cfg.get_float("train.gamma", 0.1);
    ckpt_dir = cfg.get_string("checkpoint.dir", "output/cls");

    size_t per_rank = (train_set->size() + world - 1) / world;
    steps_per_epoch = static_cast<int64_t>(per_rank) / batch;
    if (steps_per_epoch < 1)
      bad(cfg, "train.batch_size",
          fmt::format("is larger than a worker's share of the data ({} images): no full batch per epoch", per_rank));
    steps_per_epoch = steps_per_epoch / k_merge * k_merge;
    if (steps_per_epoch < 1) bad(cfg, "strategy.gradient_merge.k_steps", "is larger than the steps of an epoch");

    std::string tbdir = cfg.get_string("log.tensorboard", "");
    if (!tbdir.empty() && rank == 0) tb = std::make_unique<EventWriter>(tbdir);

    int64_t params = 0;
    for (auto& p : model->parameters()) params += p.numel();
    log(fmt::format("dtrain-cls: rank {}/{} ({}), backend {}, model {} width {} ({} parameters), {} train / {} eval "
                    "images, batch {} per worker ({} global), {} steps per epoch, {} threads, strategy: {}",
                    rank, world, job.role.source, job.comm ? job.comm->backend_name() : std::string("none"), name,
                    cfg.get_float("model.width", 1.0), params, train_set->size(), eval_set->size(), batch,
                    batch * world, steps_per_epoch, torch::get_num_threads(), so.describe()));
    resume();
  }

  // ---- checkpoints ----
  std::string latest_path() const { return (fs::path(ckpt_dir) / "latest.pt").string(); }

  void save_checkpoint() {
    dp->average_buffers();  // every rank, so the saved statistics are everyone's
    if (rank != 0) return;
    fs::create_directories(ckpt_dir);
    std::string final_path = latest_path();
    std::string tmp = final_path + ".tmp." + std::to_string(getpid());
    torch::serialize::OutputArchive ar;
    torch::serialize::OutputArchive m, o;
    model->save(m);
    opt->save(o);
    ar.write("model", m);
    ar.write("optimizer", o);
    ar.write("epoch", torch::tensor(epoch, torch::kInt64));
    ar.write("batch_in_epoch", torch::tensor(batch_in_epoch, torch::kInt64));
    ar.write("global_step", torch::tensor(global_step, torch::kInt64));
    ar.write("world_size", torch::tensor(int64_t(world), torch::kInt64));
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lk(gen.mutex());
      ar.write("rng", gen.get_state());
    }
    ar.save_to(tmp);
    fsync_path(tmp, false);
    fs::rename(tmp, final_path);
    fsync_path(ckpt_dir, true);
    log(fmt::format("checkpoint: {} (epoch {}, step {})", final_path, epoch, global_step));
  }

  void resume() {
    std::string r = cfg.get_string("checkpoint.resume", "false");
    if (r == "false" || r.empty()) return;
    std::string path = r == "true" ? latest_path() : r;
    if (!fs::exists(path)) {
      if (r == "true") {
        log("resume: no checkpoint at " + path + " yet; starting from scratch");
        return;
      }
      bad(cfg, "checkpoint.resume", "checkpoint '" + path + "' does not exist");
    }
    torch::serialize::InputArchive ar;
    ar.load_from(path);
    torch::serialize::InputArchive m, o;
    ar.read("model", m);
    ar.read("optimizer", o);
    model->load(m);
    opt->load(o);
    auto read_int = [&](const char* key) {
      torch::Tensor t;
      ar.read(key, t);
      return t.item<int64_t>();
    };
    epoch = read_int("epoch");
    batch_in_epoch = read_int("batch_in_epoch");
    global_step = read_int("global_step");
    torch::Tensor rng;
    ar.read("rng", rng);
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lk(gen.mutex());
      gen.set_state(rng);
    }
    if (batch_in_epoch >= steps_per_epoch) {
      ++epoch;
      batch_in_epoch = 0;
    }
    log(fmt::format("resume: {} -> epoch {}, step {} of the epoch, global step {}", path, epoch, batch_in_epoch,
                    global_step));
  }

  // ---- evaluation ----
  void evaluate() {
    dp->average_buffers();
    model->eval();
    torch::NoGradGuard ng;
    auto t0 = Clock::now();
    std::vector<size_t> idx;
    for (size_t i = static_cast<size_t>(rank); i < eval_set->size(); i += static_cast<size_t>(world)) idx.push_back(i);
    std::vector<double> sums(4, 0.0);  // loss, top1, top5, count
    if (!idx.empty()) {
      BatchLoader loader(eval_set, idx, eval_batch, false, aug, false, seed, 0);
      Batch b;
      while (loader.next(&b)) {
        auto out = any.forward(b.images);
        sums[0] += torch::nn::functional::cross_entropy(
                       out, b.labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                       .item<double>();
        int64_t k = std::min<int64_t>(5, out.size(1));
        auto top = std::get<1>(out.topk(k, 1));
        auto hit = top.eq(b.labels.unsqueeze(1));
        sums[1] += hit.select(1, 0).sum().item<double>();
        sums[2] += hit.any(1).sum().item<double>();
        sums[3] += double(b.labels.size(0));
      }
    }
    dp->allreduce_sum(sums);
    double n = std::max(1.0, sums[3]);
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    log(fmt::format("eval epoch {}: top1 {:.4f} top5 {:.4f} loss {:.4f} ({} images, {:.1f} s)", epoch + 1,
                    sums[1] / n, sums[2] / n, sums[0] / n, int64_t(sums[3]), secs));
    if (tb) {
      tb->add_scalar("eval/top1", float(sums[1] / n), global_step);
      tb->add_scalar("eval/top5", float(sums[2] / n), global_step);
      tb->add_scalar("eval/loss", float(sums[0] / n), global_step);
      tb->flush();
    }
    model->train();
  }

  void dump_params() {
    std::string path = cfg.get_string("debug.dump_params", "");
    if (path.empty()) return;
    for (size_t p; (p = path.find("{rank}")) != std::string::npos;) path.replace(p, 6, std::to_string(rank));
    if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
    std::ofstream out(path, std::ios::binary);
    uint64_t h = 1469598103934665603ULL;
    for (auto& kv : model->named_parameters()) {
      auto t = kv.value().contiguous();
      const char* p = static_cast<const char*>(t.data_ptr());
      size_t n = static_cast<size_t>(t.numel()) * t.element_size();
      out.write(p, static_cast<std::streamsize>(n));
      for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint8_t>(p[i])) * 1099511628211ULL;
    }
    if (!out) throw IoError("cannot write '" + path + "'");
    log(fmt::format("params: {} fnv1a64 {:016x}", path, h));
  }

  // ---- training ----
  void train() {
    const int64_t max_steps = cfg.get_int("train.max_steps", 0);
    const int64_t kill_at = cfg.get_int("debug.kill_at_step", 0);
    const int64_t ckpt_epochs = cfg.get_int("checkpoint.every_epochs", 1);
    const int64_t ckpt_steps = cfg.get_int("checkpoint.every_steps", 0);
    const int64_t eval_epochs = cfg.get_int("eval.every_epochs", 1);
    const int64_t total_steps = steps_per_epoch * epochs;
    model->train();
    auto run_start = Clock::now();
    int64_t run_start_step = global_step;
    bool stopped = false;
    for (; epoch < epochs && !stopped; ++epoch, batch_in_epoch = 0) {
      auto idx = shard_indices(train_set->size(), rank, world, seed, epoch, true);
      BatchLoader loader(train_set, idx, batch, true, aug, true, seed, epoch, batch_in_epoch,
                         static_cast<int>(cfg.get_int("data.prefetch", 4)));
      double win_loss = 0, win_correct = 0, win_count = 0, win_data = loader.wait_seconds();
      auto win_start = Clock::now();
      dp->reset_stats();
      Batch b;
      while (batch_in_epoch < steps_per_epoch && loader.next(&b)) {
        double lr = lr_at(global_step);
        for (auto& g : opt->param_groups()) static_cast<torch::optim::SGDOptions&>(g.options()).lr(lr);
        dp->begin_step(global_step);
        auto out = any.forward(b.images);
        auto loss = torch::nn::functional::cross_entropy(out, b.labels);
        loss.backward();
        dp->end_backward(global_step);
        if (dp->optimizer_step_at(global_step)) {
          opt->step();
          dp->after_optimizer_step(global_step);
          opt->zero_grad();
        }
        win_loss += loss.item<double>() * double(b.labels.size(0));
        win_correct += out.argmax(1).eq(b.labels).sum().item<double>();
        win_count += double(b.labels.size(0));
        ++global_step;
        ++batch_in_epoch;

        if (global_step % log_every == 0 || batch_in_epoch == steps_per_epoch) {
          double secs = std::chrono::duration<double>(Clock::now() - win_start).count();
          double run_secs = std::chrono::duration<double>(Clock::now() - run_start).count();
          double ips = win_count * world / std::max(secs, 1e-9);
          double per_step = run_secs / double(std::max<int64_t>(1, global_step - run_start_step));
          int64_t left = (max_steps > 0 ? std::min(total_steps, max_steps) : total_steps) - global_step;
          auto st = dp->stats();
          log(fmt::format("epoch {}/{} step {}/{} loss {:.6f} acc {:.4f} lr {:.6f} images/s {:.1f} eta {} "
                          "comm_wait {:.1f} ms/step data_wait {:.1f} ms/step",
                          epoch + 1, epochs, batch_in_epoch, steps_per_epoch, win_loss / win_count,
                          win_correct / win_count, lr, ips, hms(per_step * double(left)),
                          1e3 * st.wait_seconds / std::max(1.0, win_count / double(batch)),
                          1e3 * (loader.wait_seconds() - win_data) / std::max(1.0, win_count / double(batch))));
          if (tb) {
            tb->add_scalar("train/loss", float(win_loss / win_count), global_step);
            tb->add_scalar("train/acc", float(win_correct / win_count), global_step);
            tb->add_scalar("train/lr", float(lr), global_step);
            tb->add_scalar("train/images_per_s", float(ips), global_step);
            tb->flush();
          }
          win_loss = win_correct = win_count = 0;
          win_data = loader.wait_seconds();
          win_start = Clock::now();
          dp->reset_stats();
        }
        bool at_boundary = global_step % k_merge == 0;
        if (ckpt_steps > 0 && at_boundary && global_step % ckpt_steps == 0 && batch_in_epoch < steps_per_epoch)
          save_checkpoint();
        if (kill_at > 0 && global_step == kill_at && job.role.restart_count == 0) {
          log(fmt::format("debug.kill_at_step: killing this worker after step {}", global_step));
          std::raise(SIGKILL);
        }
        if (max_steps > 0 && global_step >= max_steps) {
          stopped = true;
          break;
        }
      }
      bool last = epoch + 1 == epochs || stopped;
      if (batch_in_epoch == steps_per_epoch && !last && ckpt_epochs > 0 && (epoch + 1) % ckpt_epochs == 0) {
        save_checkpoint();
      }
      if (last || (eval_epochs > 0 && (epoch + 1) % eval_epochs == 0)) evaluate();
      if (last) {
        save_checkpoint();
        if (stopped) break;
      }
    }
    double total = std::chrono::duration<double>(Clock::now() - run_start).count();
    log(fmt::format("done: {} steps in {} ({:.1f} s)", global_step - run_start_step, hms(total), total));
    dump_params();
  }
};

}  // namespace

int cls_main(int argc, char** argv) {
  CLI::App app{"dtrain-cls: data-parallel image classification (ResNet on Fashion-MNIST or PaddleClas lists)"};
  std::string job_file;
  std::vector<std::string> overrides;
  app.add_option("job", job_file, "job file (TOML), e.g. apps/cls.toml")->required();
  app.add_option("-o,--override", overrides, "override a key: -o train.epochs=2 (repeatable)");
  CLI11_PARSE(app, argc, argv);
  try {
    Trainer t;
    t.cfg = load_cls_config(job_file, overrides);
    RoleInfo role = resolve_role(&t.cfg);
    t.job = join_job(JobOptions::from_config(t.cfg), role);
    t.setup();
    t.train();
    return 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "dtrain-cls: error: %s\n", e.what_without_backtrace());
    std::fflush(stderr);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-cls: error: %s\n", e.what());
    std::fflush(stderr);
    return 1;
  } catch (...) {
    std::fprintf(stderr, "dtrain-cls: error: unknown exception\n");
    return 1;
  }
}

}  // namespace dtrain::apps
